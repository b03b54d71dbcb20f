"""``truncation: "auto"``: drop the oldest conversation items until the prompt fits.

OpenAI's rule: when the input would exceed the context window, items are dropped from the
beginning of the conversation. Here, what "fits" means is the caller's (the service: prompt plus
``max_output_tokens`` within the engine's ``max_model_len``); this module decides *which* items
may go and finds the fewest to drop:

- Instructions are never dropped: the request's ``instructions`` are not items, and ``system``
  and ``developer`` messages stay where they stand (a system message is merged into the
  instructions, see :mod:`domain.prompt`).
- Only a prefix of the other items is dropped (the oldest first), and never all of them: the
  last one, what the request asks now, stays. A prompt that does not fit with only that left is
  refused, as with ``truncation: "disabled"``.
- A tool call and its output go together: a cut that would keep a ``function_call_output`` (or
  ``custom_tool_call_output``) whose call is dropped is not a cut point (Harmony could not say
  which tool answered, and :mod:`domain.prompt` refuses such an output). An ``item_reference``
  counts as the item it names.
- The prompt's length only falls as more items are dropped, so the fewest items are found by a
  binary search over the cut points: a few renders, each mostly from the rendered-message cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Truncated", "cut_points", "drop_oldest", "fit", "truncation_audit"]

Item = Mapping[str, object]
R = TypeVar("R")

_CALLS = frozenset({"function_call", "custom_tool_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


@dataclass(frozen=True)
class Truncated(Generic[R]):
    """A conversation with its oldest items dropped, and what ``measure`` made of it."""

    items: tuple[Item, ...]
    #: How many of ``items`` come from the ``previous_response_id`` chain.
    history_length: int
    #: The dropped items' ids (``None`` for an item without one), oldest first.
    dropped_ids: tuple[str | None, ...]
    result: R

    @property
    def dropped(self) -> int:
        return len(self.dropped_ids)


def _kept_always(item: Item) -> bool:
    kind = item.get("type", "message" if "role" in item else None)
    return kind == "message" and item.get("role") in ("system", "developer")


def _resolved(item: Item, resolve: Callable[[str], Item | None] | None) -> Item:
    if item.get("type") == "item_reference" and resolve is not None:
        ref = item.get("id")
        target = None
        if isinstance(ref, str):
            try:
                target = resolve(ref)
            except LookupError:
                target = None
        if target is not None:
            return target
    return item


def _droppable(items: Sequence[Item]) -> list[int]:
    """Positions of the items that may be dropped, oldest first."""
    return [k for k, item in enumerate(items) if not _kept_always(item)]


def cut_points(
    items: Sequence[Item], resolve: Callable[[str], Item | None] | None = None
) -> list[int]:
    """The numbers ``n`` of droppable items that may be dropped from the front (ascending,
    ``0`` first): every call whose output is kept is kept, and the last droppable item stays."""
    positions = _droppable(items)
    count = len(positions)
    if count == 0:
        return [0]
    # a cut n drops droppable items [0, n); a call at i with its output at j forbids i < n <= j
    forbidden = [0] * (count + 2)
    call_at: dict[str, int] = {}
    for rank, position in enumerate(positions):
        item = _resolved(items[position], resolve)
        kind = item.get("type")
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            continue
        if kind in _CALLS:
            call_at[call_id] = rank
        elif kind in _OUTPUTS and call_id in call_at:
            forbidden[call_at[call_id] + 1] += 1
            forbidden[rank + 1] -= 1
    points = []
    running = 0
    for n in range(count):  # n == count would drop the last item too
        running += forbidden[n]
        if running == 0:
            points.append(n)
    return points


def drop_oldest(
    items: Sequence[Item], n: int, history_length: int
) -> tuple[tuple[Item, ...], int, tuple[Item, ...]]:
    """``items`` less their ``n`` oldest droppable ones: (kept, kept history length, dropped)."""
    positions = set(_droppable(items)[:n])
    kept = tuple(item for k, item in enumerate(items) if k not in positions)
    dropped = tuple(items[k] for k in sorted(positions))
    history = history_length - sum(1 for k in positions if k < history_length)
    return kept, history, dropped


def fit(
    items: Sequence[Item],
    history_length: int,
    measure: Callable[[Sequence[Item], int], R],
    fits: Callable[[R], bool],
    *,
    resolve: Callable[[str], Item | None] | None = None,
) -> Truncated[R] | None:
    """The conversation with the fewest oldest items dropped for which ``fits(measure(items,
    history_length))`` holds, or None when even the most that may be dropped is not enough.
    ``measure`` renders a conversation (``history_length``: how many of its items are history)."""
    points = cut_points(items, resolve)
    results: dict[int, tuple[tuple[Item, ...], int, tuple[Item, ...], R]] = {}

    def attempt(n: int) -> bool:
        kept, history, dropped = drop_oldest(items, n, history_length)
        result = measure(kept, history)
        results[n] = (kept, history, dropped, result)
        return fits(result)

    if not attempt(points[-1]):
        return None
    low, high = 0, len(points) - 1  # points[high] fits; find the first that does
    while low < high:
        middle = (low + high) // 2
        if attempt(points[middle]):
            high = middle
        else:
            low = middle + 1
    kept, history, dropped, result = results[points[high]]
    return Truncated(
        items=kept, history_length=history, dropped_ids=tuple(map(_id, dropped)), result=result
    )


def _id(item: Item) -> str | None:
    value = item.get("id")
    return value if isinstance(value, str) else None


def truncation_audit(truncated: Truncated[Any] | None) -> dict[str, object]:
    """What the prompt's audit record says of a truncation: nothing when there was none."""
    if truncated is None:
        return {}
    return {
        "truncation": {
            "dropped_items": truncated.dropped,
            "dropped_ids": list(truncated.dropped_ids),
        }
    }

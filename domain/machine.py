"""The response state machine: which event may follow which.

:func:`apply` checks one event against the state reached so far and returns the next state, or
raises :class:`~domain.errors.InvariantViolation` naming the broken rule. It is pure; the builder
runs every event it makes through it, and tests run whole logs through :func:`check_log`.

Rules (``InvariantViolation.rule``):

- ``seq_not_contiguous``: ``sequence_number`` must be 0, 1, 2, ... with no gap.
- ``created_not_first`` / ``created_twice``: ``response.created`` opens every log, once.
- ``bad_status_transition``: queued -> in_progress -> one terminal status; no going back.
- ``event_after_terminal`` / ``second_terminal``: the terminal event is the last one.
- ``terminal_while_item_open``: open items are closed before the terminal event.
- ``terminal_status_mismatch``: ``response.completed`` carries ``status: "completed"``, etc.
- ``item_already_open``: gpt-oss writes one message at a time, so the ledger opens one item at a
  time (a deliberate narrowing of what the OpenAI stream format allows).
- ``output_index_not_dense``: the n-th ``output_item.added`` has ``output_index`` n.
- ``unknown_item_type``: only message, reasoning, function_call, custom_tool_call and compaction
  items (a compaction has no deltas: its sealed content arrives whole with ``output_item.done``).
- ``delta_for_closed_item``: a delta, part or done event for an item that is not open.
- ``wrong_event_for_item``: e.g. a text delta for a function call.
- ``content_index_not_dense``: parts of an item are numbered 0, 1, ... and restart per item.
- ``part_not_open`` / ``part_still_open``: text events need an open part; parts close before items.
- ``item_id_changed`` / ``call_id_changed``: ids minted at ``added`` never change.
- ``response.compaction.compacting`` only for the open compaction item.
- ``done_differs_from_deltas``: every ``.done`` value equals the concatenation of its deltas.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any, NamedTuple, assert_never

from domain.errors import InvariantViolation
from domain.events import (
    CompactionCompacting,
    ContentPartAdded,
    ContentPartDone,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCancelled,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
)

__all__ = ["INITIAL", "LogState", "OpenItem", "apply", "check_log"]

ITEM_TYPES = frozenset({"message", "reasoning", "function_call", "custom_tool_call", "compaction"})
#: Items with no streamed text: nothing to fingerprint.
_OPAQUE = frozenset({"compaction"})
_PART_TYPE = {"message": "output_text", "reasoning": "reasoning_text"}
_TERMINAL_STATUS = {
    ResponseCompleted: "completed",
    ResponseIncomplete: "incomplete",
    ResponseFailed: "failed",
    ResponseCancelled: "cancelled",
}


class OpenItem(NamedTuple):
    """The item between its ``output_item.added`` and ``output_item.done``.

    The state types are immutable NamedTuples rather than frozen dataclasses: a new state is made
    for every token, and a tuple is several times cheaper to build than a frozen dataclass, whose
    ``__init__`` goes through ``object.__setattr__`` field by field."""

    output_index: int
    item_id: str
    item_type: str
    call_id: str | None
    #: Fingerprint (length, CRC-32 of the UTF-8) of each content part's text so far; for calls,
    #: one entry: the arguments / input so far. A fingerprint instead of the text keeps a delta
    #: O(len(delta)) rather than O(len(text so far)); ``.done`` values are compared against it.
    parts: tuple[tuple[int, int], ...]
    part_open: bool = False
    #: The open part's (or call's) ``.done`` text event was seen; no more deltas for it.
    text_done: bool = False


class LogState(NamedTuple):
    next_seq: int = 0
    status: str | None = None
    items_added: int = 0
    open_item: OpenItem | None = None
    terminal: bool = False


INITIAL = LogState()


def _fail(rule: str, message: str) -> InvariantViolation:
    return InvariantViolation(rule, message)


def _open_item(state: LogState, item_id: str, output_index: int, what: str) -> OpenItem:
    item = state.open_item
    if item is None or item.item_id != item_id or item.output_index != output_index:
        raise _fail(
            "delta_for_closed_item",
            f"{what} for item {item_id!r} at output_index {output_index}, which is not open",
        )
    return item


def _text_target(
    state: LogState, item_type: str, item_id: str, output_index: int, content_index: int, what: str
) -> OpenItem:
    item = _open_item(state, item_id, output_index, what)
    if item.item_type != item_type:
        raise _fail("wrong_event_for_item", f"{what} for a {item.item_type} item")
    if not item.part_open or content_index != len(item.parts) - 1:
        raise _fail("part_not_open", f"{what} for content_index {content_index}, which is not open")
    if item.text_done:
        raise _fail("delta_for_closed_item", f"{what} after the part's text was done")
    return item


def _call_target(
    state: LogState, item_type: str, item_id: str, output_index: int, what: str
) -> OpenItem:
    item = _open_item(state, item_id, output_index, what)
    if item.item_type != item_type:
        raise _fail("wrong_event_for_item", f"{what} for a {item.item_type} item")
    if item.text_done:
        raise _fail("delta_for_closed_item", f"{what} after the call's input was done")
    return item


EMPTY: tuple[int, int] = (0, 0)


def fingerprint(text: str, start: tuple[int, int] = EMPTY) -> tuple[int, int]:
    """(length, CRC-32) of ``start``'s text followed by ``text``."""
    return (start[0] + len(text), zlib.crc32(text.encode("utf-8", "surrogatepass"), start[1]))


_new = tuple.__new__
_crc32 = zlib.crc32


def _append(state: LogState, item: OpenItem, delta: str, next_seq: int) -> LogState:
    """The state after a delta of ``delta`` to the open ``item``, with ``next_seq`` next.

    The per-token path: the new tuples are made with ``tuple.__new__`` (a NamedTuple's own
    constructor adds a Python call per tuple), and only the last part's fingerprint changes."""
    parts = item.parts
    last = parts[-1]  # ``fingerprint``, inlined: a call a token
    mark = (last[0] + len(delta), _crc32(delta.encode("utf-8", "surrogatepass"), last[1]))
    parts = (mark,) if len(parts) == 1 else (*parts[:-1], mark)
    new_item = _new(OpenItem, (item[0], item[1], item[2], item[3], parts, item[5], item[6]))
    return _new(LogState, (next_seq, state[1], state[2], new_item, state[4]))  # type: ignore[no-any-return]


def extend_delta(state: LogState, text: str) -> LogState:
    """The state after ``text`` joins the open item's last delta, already applied: its text
    grows, no seq is taken (a coalescing builder's deltas, ``domain.builder``)."""
    item = state.open_item
    if item is None or item.text_done or not item.parts:
        raise _fail("delta_for_closed_item", "text joined to a delta of no open item")
    return _append(state, item, text, state.next_seq)


def _check_done(expected: tuple[int, int], got: str, what: str) -> None:
    if fingerprint(got) != expected:
        raise _fail(
            "done_differs_from_deltas",
            f"{what} is {got[:80]!r} ({len(got)} chars) but its deltas concatenate to "
            f"other text ({expected[0]} chars)",
        )


def _item_texts(item: dict[str, Any]) -> tuple[str, ...]:
    if item["type"] in _PART_TYPE:
        return tuple(part.get("text", "") for part in item.get("content") or ())
    if item["type"] == "function_call":
        return (item.get("arguments", ""),)
    if item["type"] in _OPAQUE:
        return ()
    return (item.get("input", ""),)


def _status_event(state: LogState, status: str, allowed_from: tuple[str, ...]) -> LogState:
    if state.status not in allowed_from:
        raise _fail("bad_status_transition", f"{state.status} -> {status}")
    return state._replace(status=status)


_TEXT_DELTAS: dict[type[Any], str] = {OutputTextDelta: "message", ReasoningTextDelta: "reasoning"}


def apply(state: LogState, event: Event) -> LogState:
    """Check ``event`` against ``state``; return the state after it."""
    item_type = _TEXT_DELTAS.get(type(event))
    if item_type is not None:
        # The per-token path: a text delta that breaks no rule (the same checks as below, in
        # one condition); anything else falls through to find the rule it breaks.
        e: Any = event
        item = state.open_item
        if (
            item is not None
            and e.sequence_number == state.next_seq
            and not state.terminal
            and state.status is not None
            and item.item_id == e.item_id
            and item.output_index == e.output_index
            and item.item_type == item_type
            and item.part_open
            and not item.text_done
            and e.content_index == len(item.parts) - 1
        ):
            return _append(state, item, e.delta, state.next_seq + 1)
    if state.terminal:
        is_terminal = type(event) in _TERMINAL_STATUS
        raise _fail(
            "second_terminal" if is_terminal else "event_after_terminal",
            f"{event.type} after the terminal event",
        )
    if event.sequence_number != state.next_seq:
        raise _fail(
            "seq_not_contiguous",
            f"{event.type} has sequence_number {event.sequence_number}, expected {state.next_seq}",
        )
    if state.status is None and not isinstance(event, ResponseCreated):
        raise _fail("created_not_first", f"{event.type} before response.created")
    state = LogState(
        state.next_seq + 1, state.status, state.items_added, state.open_item, state.terminal
    )

    match event:  # the per-token deltas first: the cases are tried in order
        case OutputTextDelta():
            item = _text_target(
                state, "message", event.item_id, event.output_index, event.content_index, event.type
            )
            return _append(state, item, event.delta, state.next_seq)
        case ReasoningTextDelta():
            item = _text_target(
                state,
                "reasoning",
                event.item_id,
                event.output_index,
                event.content_index,
                event.type,
            )
            return _append(state, item, event.delta, state.next_seq)
        case ResponseCreated():
            if state.status is not None:
                raise _fail("created_twice", "a second response.created")
            status = event.response.get("status")
            if status not in ("queued", "in_progress"):
                raise _fail("bad_status_transition", f"created with status {status!r}")
            return state._replace(status=status)
        case ResponseQueued():
            return _status_event(state, "queued", ("queued",))
        case ResponseInProgress():
            return _status_event(state, "in_progress", ("queued", "in_progress"))
        case ResponseCompleted() | ResponseIncomplete() | ResponseFailed() | ResponseCancelled():
            if state.open_item is not None:
                raise _fail(
                    "terminal_while_item_open",
                    f"{event.type} while item {state.open_item.item_id!r} is open",
                )
            expected = _TERMINAL_STATUS[type(event)]
            if event.response.get("status") != expected:
                raise _fail(
                    "terminal_status_mismatch",
                    f"{event.type} carries status {event.response.get('status')!r}",
                )
            return state._replace(status=expected, terminal=True)
        case OutputItemAdded():
            if state.open_item is not None:
                raise _fail("item_already_open", f"item {state.open_item.item_id!r} is still open")
            if event.output_index != state.items_added:
                raise _fail(
                    "output_index_not_dense",
                    f"output_index {event.output_index}, expected {state.items_added}",
                )
            item_type = event.item.get("type")
            if item_type not in ITEM_TYPES:
                raise _fail("unknown_item_type", f"item type {item_type!r}")
            wire_item = event.item
            parts: tuple[tuple[int, int], ...] = (
                ()
                if item_type in _PART_TYPE or item_type in _OPAQUE
                else (fingerprint(_item_texts(wire_item)[0]),)
            )
            return state._replace(
                items_added=state.items_added + 1,
                open_item=OpenItem(
                    output_index=event.output_index,
                    item_id=wire_item["id"],
                    item_type=item_type,
                    call_id=wire_item.get("call_id"),
                    parts=parts,
                ),
            )
        case OutputItemDone():
            open_ = state.open_item
            if open_ is None or open_.output_index != event.output_index:
                raise _fail(
                    "delta_for_closed_item",
                    f"output_item.done for output_index {event.output_index}, which is not open",
                )
            if event.item.get("id") != open_.item_id:
                raise _fail(
                    "item_id_changed", f"item id {open_.item_id!r} became {event.item.get('id')!r}"
                )
            if event.item.get("call_id") != open_.call_id:
                raise _fail(
                    "call_id_changed",
                    f"call_id {open_.call_id!r} became {event.item.get('call_id')!r}",
                )
            if open_.part_open:
                raise _fail("part_still_open", "output_item.done while a content part is open")
            texts = _item_texts(event.item)
            if len(texts) != len(open_.parts):
                raise _fail("done_differs_from_deltas", "output_item.done has other content parts")
            for part_print, text in zip(open_.parts, texts, strict=True):
                _check_done(part_print, text, "output_item.done")
            return state._replace(open_item=None)
        case ContentPartAdded():
            open_ = _open_item(state, event.item_id, event.output_index, "content_part.added")
            part_type = _PART_TYPE.get(open_.item_type)
            if part_type is None or event.part.get("type") not in (part_type, "refusal"):
                raise _fail("wrong_event_for_item", f"a content part for a {open_.item_type} item")
            if open_.part_open:
                raise _fail("part_still_open", "content_part.added while another part is open")
            if event.content_index != len(open_.parts):
                raise _fail(
                    "content_index_not_dense",
                    f"content_index {event.content_index}, expected {len(open_.parts)}",
                )
            if event.part.get("text", ""):
                raise _fail("done_differs_from_deltas", "a content part must start empty")
            return state._replace(
                open_item=open_._replace(
                    parts=(*open_.parts, EMPTY), part_open=True, text_done=False
                ),
            )
        case ContentPartDone():
            open_ = _open_item(state, event.item_id, event.output_index, "content_part.done")
            if not open_.part_open or event.content_index != len(open_.parts) - 1:
                raise _fail("part_not_open", f"content_part.done for {event.content_index}")
            _check_done(open_.parts[-1], event.part.get("text", ""), "content_part.done")
            return state._replace(open_item=open_._replace(part_open=False, text_done=False))
        case OutputTextDone():
            item = _text_target(
                state, "message", event.item_id, event.output_index, event.content_index, event.type
            )
            _check_done(item.parts[-1], event.text, event.type)
            return state._replace(open_item=item._replace(text_done=True))
        case ReasoningTextDone():
            item = _text_target(
                state,
                "reasoning",
                event.item_id,
                event.output_index,
                event.content_index,
                event.type,
            )
            _check_done(item.parts[-1], event.text, event.type)
            return state._replace(open_item=item._replace(text_done=True))
        case FunctionCallArgumentsDelta():
            item = _call_target(
                state, "function_call", event.item_id, event.output_index, event.type
            )
            return _append(state, item, event.delta, state.next_seq)
        case CustomToolCallInputDelta():
            item = _call_target(
                state, "custom_tool_call", event.item_id, event.output_index, event.type
            )
            return _append(state, item, event.delta, state.next_seq)
        case FunctionCallArgumentsDone():
            item = _call_target(
                state, "function_call", event.item_id, event.output_index, event.type
            )
            _check_done(item.parts[-1], event.arguments, event.type)
            return state._replace(open_item=item._replace(text_done=True))
        case CustomToolCallInputDone():
            item = _call_target(
                state, "custom_tool_call", event.item_id, event.output_index, event.type
            )
            _check_done(item.parts[-1], event.input, event.type)
            return state._replace(open_item=item._replace(text_done=True))
        case CompactionCompacting():
            item = _open_item(state, event.item_id, event.output_index, event.type)
            if item.item_type != "compaction":
                raise _fail("wrong_event_for_item", f"{event.type} for a {item.item_type} item")
            return state
        case _:
            assert_never(event)


def check_log(events: Iterable[Event], state: LogState = INITIAL) -> LogState:
    """Run a whole log (or a suffix, from ``state``) through the state machine."""
    for event in events:
        state = apply(state, event)
    return state

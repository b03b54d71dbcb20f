"""The item index: where each stored item is, so that an ``item_reference`` can name any of them.

Every item a stored response holds has a row in ``item_index`` (migration 0006): its input items
(written with the response row) and its output items (written with their
``response.output_item.done`` event; only those events add a row, so a streamed token costs
nothing more). A row says where the item is, not what it is: the item itself stays where it
already was (``response_input_items``, or the event's payload), so the index adds a few dozen
bytes per item and the log stays the only copy of what was said.

The project is not in the index: it is the response's, joined at read time. An append then never
needs to know whose response it writes to (the store's write path does not look it up), and an
item of another project is found by no read, exactly like one that does not exist.

One id may be in several places (a client replays an output item, with its id, as input of the
next request). A look-up takes the output item over an input copy of it, then the newest
response: what the model said, not what a client sent back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

from persistence.lifecycle import OUTPUT_ITEM_DONE
from persistence.records import JsonObject, StoredEvent

__all__ = ["IndexRow", "LocatedItem", "Source", "input_rows", "output_row", "pick"]

Source = Literal["input", "output"]
#: A row of ``item_index``: (item_id, response_id, source, position, seq).
IndexRow = tuple[str, str, str, int, int | None]


class LocatedItem(NamedTuple):
    """A stored item and where it is: ``source`` "input" (``position`` in the response's input
    items) or "output" (``position`` is its ``output_index``)."""

    response_id: str
    source: Source
    position: int
    item: JsonObject


def input_rows(response_id: str, items: Sequence[JsonObject]) -> list[IndexRow]:
    """The index rows of a response's normalised input items. An ``item_reference`` is not an
    item (its id names another one) and gets none."""
    return [
        (item["id"], response_id, "input", position, None)
        for position, item in enumerate(items)
        if isinstance(item.get("id"), str) and item.get("type") != "item_reference"
    ]


def output_row(response_id: str, event: StoredEvent) -> IndexRow | None:
    """The index row an ``output_item.done`` event adds (None for any other event)."""
    if event.type != OUTPUT_ITEM_DONE:
        return None
    payload = event.payload
    item = payload.get("item")
    index = payload.get("output_index")
    if (
        not isinstance(item, dict)
        or not isinstance(item.get("id"), str)
        or not isinstance(index, int)
    ):
        return None
    return (item["id"], response_id, "output", index, event.seq)


def pick(rows: Iterable[tuple[str, str, str, int, Any, str | None]]) -> dict[str, LocatedItem]:
    """The item for each id from look-up rows (item_id, response_id, source, position, input
    item, output event's payload JSON) ordered by id, output first, newest response first."""
    found: dict[str, LocatedItem] = {}
    for item_id, response_id, source, position, input_item, event_json in rows:
        if item_id in found:
            continue
        if source == "output":
            if event_json is None:
                continue
            item = json.loads(event_json).get("item")
            if not isinstance(item, dict):
                continue
            found[item_id] = LocatedItem(response_id, "output", position, item)
        elif isinstance(input_item, dict):
            found[item_id] = LocatedItem(response_id, "input", position, input_item)
    return found

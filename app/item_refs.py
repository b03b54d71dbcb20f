"""``item_reference``: what an input item ``{"type": "item_reference", "id": ...}`` stands for.

OpenAI resolves a reference to any stored item of the caller's project, and clients rely on it:
the Vercel AI SDK sends every earlier reasoning item and assistant message of a chat back as a
reference, with no ``previous_response_id``. A reference resolves, in this order, to

1. an item of the ``previous_response_id`` chain or of this request's own input (no query), then
2. any stored item of the project: an input item or an output item of any stored response, found
   through the item index (``persistence.item_index``, one query for all of a request's
   references), then
3. an item a conversation of the project holds now (``ConversationStore.find_items``: added
   through the conversation items API; a response's own items are found in step 2).

An output item is replayed as the input item a client would send for it (as the chain replays
it). An id of another project resolves to nothing, exactly like a missing one: the prompt
renderer then answers 400 ``No item found with id ...`` naming the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain.projections import output_as_input
from persistence.store import EventStore

__all__ = ["resolve"]

Item = dict[str, Any]


async def resolve(store: EventStore, project: str, items: Sequence[Item]) -> dict[str, Item]:
    """Every item an ``item_reference`` among ``items`` (history, then this request's input)
    may name, by id: the items themselves, and the stored items of ``project`` that they
    reference and do not hold."""
    known: dict[str, Item] = {
        item["id"]: item
        for item in items
        if isinstance(item.get("id"), str) and item.get("type") != "item_reference"
    }
    wanted = sorted(
        {
            item["id"]
            for item in items
            if item.get("type") == "item_reference"
            and isinstance(item.get("id"), str)
            and item["id"] not in known
        }
    )
    if wanted:
        for item_id, located in (await store.find_items(wanted, project=project)).items():
            known[item_id] = (
                output_as_input(located.item) if located.source == "output" else located.item
            )
        missing = [item_id for item_id in wanted if item_id not in known]
        if missing:
            held = await store.conversations.find_items(missing, project)
            known.update((item_id, output_as_input(item)) for item_id, item in held.items())
    return known

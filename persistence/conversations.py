"""Conversations: the contract every store keeps for them, and the in-memory one.

A conversation is an append-only log of items (``conversation_items``): adding items appends
``added`` entries, deleting an item appends a ``deleted`` entry for its id. Nothing is ever
rewritten, so the log shows every item a conversation ever held and when it left; the reads
(``items``, ``list_items``, ``get_item``) show the items it holds now, in the order they were
added. An item id is unique within its conversation, deleted or not (a second add of the same id
is ``DuplicateItem``): retrieve and delete name one item, and a log never holds two of the same.

Every call is scoped by ``project``: a conversation of another project, or a deleted one, is
``NotFound`` exactly like one that never existed. Deleting a conversation keeps its row and its
log (``deleted_at``): as with OpenAI, its items are not deleted with it, only out of reach.

``SqlStore.conversations`` (``persistence.sql_conversations``) keeps the same contract on SQLite
and PostgreSQL; one contract suite runs against all three.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from persistence.errors import NotFound, StoreError
from persistence.records import JsonObject, dump_json

__all__ = [
    "ADDED",
    "DELETED",
    "ConversationRow",
    "ConversationStore",
    "DuplicateItem",
    "MemoryConversations",
    "item_ids",
]

Order = Literal["asc", "desc"]
#: ``conversation_items.kind``.
ADDED = "added"
DELETED = "deleted"


class DuplicateItem(StoreError):
    """An item id the conversation already holds (or held) was added again."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"the conversation already has an item with id {item_id!r}")
        self.item_id = item_id


@dataclass(frozen=True, slots=True)
class ConversationRow:
    id: str
    project: str
    created_at: int
    metadata: dict[str, str] = field(default_factory=dict)


def item_ids(items: Sequence[JsonObject]) -> list[str]:
    """The ids of items about to be added (ValueError for one without a string id, or for an
    id given twice: a conversation holds each id once)."""
    ids: list[str] = []
    for position, item in enumerate(items):
        value = item.get("id")
        if not isinstance(value, str) or not value:
            raise ValueError(f"item {position} has no string id")
        ids.append(value)
    seen: set[str] = set()
    for value in ids:
        if value in seen:
            raise DuplicateItem(value)
        seen.add(value)
    return ids


class ConversationStore(Protocol):
    async def create(self, row: ConversationRow, items: Sequence[JsonObject]) -> None:
        """A new conversation holding ``items`` (each with an ``id``), durable on return."""
        ...

    async def get(self, conversation_id: str, project: str) -> ConversationRow | None: ...

    async def update(
        self, conversation_id: str, project: str, metadata: Mapping[str, str]
    ) -> ConversationRow | None:
        """Replace the metadata; None if there is no such conversation."""
        ...

    async def delete(self, conversation_id: str, project: str) -> bool: ...

    async def append(
        self,
        conversation_id: str,
        project: str,
        items: Sequence[JsonObject],
        *,
        response_id: str | None = None,
    ) -> None:
        """Add ``items`` at the end, in one transaction (``NotFound``, ``DuplicateItem``).
        ``response_id``: the response whose turn they are."""
        ...

    async def items(self, conversation_id: str, project: str) -> list[JsonObject]:
        """Every item it holds now, oldest first (``NotFound``): a response's history."""
        ...

    async def list_items(
        self,
        conversation_id: str,
        project: str,
        *,
        after: str | None,
        limit: int,
        order: Order,
    ) -> tuple[list[JsonObject], bool]:
        """A page of its items and whether more follow (``NotFound`` for the conversation or
        for an ``after`` that is not one of its items)."""
        ...

    async def get_item(self, conversation_id: str, project: str, item_id: str) -> JsonObject | None:
        """The item (``NotFound`` for the conversation; None for the item)."""
        ...

    async def delete_item(self, conversation_id: str, project: str, item_id: str) -> bool:
        """Append the item's deletion (``NotFound`` for the conversation; False if it holds no
        such item now)."""
        ...

    async def find_items(self, item_ids: Sequence[str], project: str) -> dict[str, JsonObject]:
        """The items with these ids that a conversation of ``project`` holds now (not deleted
        from it, the conversation not deleted), by id: what an ``item_reference`` names. An id
        held by several conversations resolves to the newest entry."""
        ...


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    kind: str
    item_id: str
    item_json: str | None
    response_id: str | None
    recorded_at: float


@dataclass(slots=True)
class _Conversation:
    row: ConversationRow
    log: list[_Entry] = field(default_factory=list)
    deleted: bool = False

    def live(self) -> list[_Entry]:
        gone = {e.item_id for e in self.log if e.kind == DELETED}
        return [e for e in self.log if e.kind == ADDED and e.item_id not in gone]


class MemoryConversations:
    """``MemoryStore.conversations``: JSON kept as text, so reads return fresh copies."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._conversations: dict[str, _Conversation] = {}
        self._clock = clock

    def _find(self, conversation_id: str, project: str) -> _Conversation:
        found = self._conversations.get(conversation_id)
        if found is None or found.deleted or found.row.project != project:
            raise NotFound(f"no conversation {conversation_id!r}")
        return found

    def turns(self, conversation_id: str) -> set[str]:
        """The ids of the responses whose turns appended to the conversation (any project)."""
        found = self._conversations.get(conversation_id)
        if found is None:
            return set()
        return {e.response_id for e in found.log if e.response_id is not None}

    async def create(self, row: ConversationRow, items: Sequence[JsonObject]) -> None:
        if row.id in self._conversations:
            raise StoreError(f"conversation {row.id!r} already exists")
        texts = [dump_json(item) for item in items]
        ids = item_ids(items)
        conversation = _Conversation(replace(row, metadata=dict(row.metadata)))
        self._add(conversation, ids, texts, None)
        self._conversations[row.id] = conversation

    async def get(self, conversation_id: str, project: str) -> ConversationRow | None:
        try:
            found = self._find(conversation_id, project)
        except NotFound:
            return None
        return replace(found.row, metadata=dict(found.row.metadata))

    async def update(
        self, conversation_id: str, project: str, metadata: Mapping[str, str]
    ) -> ConversationRow | None:
        try:
            found = self._find(conversation_id, project)
        except NotFound:
            return None
        found.row = replace(found.row, metadata=dict(metadata))
        return replace(found.row, metadata=dict(metadata))

    async def delete(self, conversation_id: str, project: str) -> bool:
        try:
            self._find(conversation_id, project).deleted = True
        except NotFound:
            return False
        return True

    async def append(
        self,
        conversation_id: str,
        project: str,
        items: Sequence[JsonObject],
        *,
        response_id: str | None = None,
    ) -> None:
        found = self._find(conversation_id, project)
        texts = [dump_json(item) for item in items]
        ids = item_ids(items)
        taken = {e.item_id for e in found.log if e.kind == ADDED}
        for item_id in ids:
            if item_id in taken:
                raise DuplicateItem(item_id)
        self._add(found, ids, texts, response_id)

    def _add(
        self, conversation: _Conversation, ids: list[str], texts: list[str], response_id: str | None
    ) -> None:
        now = self._clock()
        start = len(conversation.log)
        conversation.log.extend(
            _Entry(start + n, ADDED, item_id, text, response_id, now)
            for n, (item_id, text) in enumerate(zip(ids, texts, strict=True))
        )

    async def items(self, conversation_id: str, project: str) -> list[JsonObject]:
        found = self._find(conversation_id, project)
        return [json.loads(e.item_json or "null") for e in found.live()]

    async def list_items(
        self,
        conversation_id: str,
        project: str,
        *,
        after: str | None,
        limit: int,
        order: Order,
    ) -> tuple[list[JsonObject], bool]:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        live = self._find(conversation_id, project).live()
        if after is not None:
            cursor = next((e.seq for e in live if e.item_id == after), None)
            if cursor is None:
                raise NotFound(f"no item {after!r} in conversation {conversation_id!r}")
            live = [e for e in live if (e.seq > cursor if order == "asc" else e.seq < cursor)]
        if order == "desc":
            live.reverse()
        return [json.loads(e.item_json or "null") for e in live[:limit]], len(live) > limit

    async def get_item(self, conversation_id: str, project: str, item_id: str) -> JsonObject | None:
        live = self._find(conversation_id, project).live()
        found = next((e for e in live if e.item_id == item_id), None)
        return None if found is None else json.loads(found.item_json or "null")

    async def find_items(self, item_ids: Sequence[str], project: str) -> dict[str, JsonObject]:
        wanted = set(item_ids)
        found: dict[str, tuple[float, int, str]] = {}
        for conversation in self._conversations.values():
            if conversation.deleted or conversation.row.project != project:
                continue
            for entry in conversation.live():
                if entry.item_id in wanted and entry.item_json is not None:
                    key = (entry.recorded_at, entry.seq, entry.item_json)
                    found[entry.item_id] = max(found.get(entry.item_id, key), key)
        return {item_id: json.loads(text) for item_id, (_, _, text) in found.items()}

    async def delete_item(self, conversation_id: str, project: str, item_id: str) -> bool:
        conversation = self._find(conversation_id, project)
        if all(e.item_id != item_id for e in conversation.live()):
            return False
        seq = len(conversation.log)
        conversation.log.append(_Entry(seq, DELETED, item_id, None, None, self._clock()))
        return True

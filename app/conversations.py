"""The Conversations API (``/v1/conversations``) and a conversation's part in ``POST /v1/responses``.

A conversation is an append-only log of items (``persistence.conversations``): created with up
to 20 items, grown 20 at a time through ``items.create``, and by every response that names it.
Everything is scoped to the caller's project: another project's conversation is a 404 exactly
like a missing one.

- **Items are checked when they are added**, by rendering the conversation with them as a
  prompt would (``domain.prompt``): what a conversation holds can always be given to the model,
  and a bad item is a 400 naming ``items[i]...``. An ``item_reference`` cannot be added (it
  names an item elsewhere; add the item itself). Items without an ``id`` get one; an id the
  conversation already holds (or held) is a 400.
- **Deleting an item appends its deletion** to the log: listed, retrieved and given to the model
  no more, and its id is never reused. Deleting a conversation keeps its log in the database
  (as OpenAI keeps its items) and answers 404 for it from then on.
- **``conversation`` on ``POST /v1/responses``** (an id or ``{"id": ...}``; with
  ``previous_response_id`` a 400): the items the conversation holds are the prompt's history,
  before the request's input. When the response ends ``completed`` or ``incomplete`` its input
  items (less ``item_reference`` items, and ids the conversation already holds) and then its
  output items are appended, in one transaction, *before* its terminal event is written: a client
  that saw ``response.completed`` and sends the next turn at once finds the turn in the
  conversation. A response that ends ``failed`` or ``cancelled`` appends nothing, so a client
  can retry the same input without doubling it. (OpenAI appends "after the response
  completes".) Turns are appended in the order their responses end. A response continued by a
  takeover on another replica appends its turn when it ends there (``turn_of``: the stored
  request names the conversation; ids the conversation already holds are skipped, so a turn
  its first owner appended just before dying is not appended twice).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from openai_harmony import HarmonyEncoding
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.contract import INCLUDES
from app.errors import APIError, not_found
from app.reasoning_crypto import COMPACTION, ReasoningCipher
from app.wire import ITEMS_SCHEMA, METADATA_SCHEMA, check_metadata, list_page
from domain.errors import InvalidInput
from domain.projections import output_as_input
from domain.prompt import PromptRequest, render_prompt
from persistence.conversations import ConversationRow, DuplicateItem
from persistence.errors import NotFound
from persistence.records import ResponseRow, dump_json
from persistence.store import EventStore

__all__ = [
    "MAX_ITEMS",
    "ConversationTurn",
    "Conversations",
    "CreateConversation",
    "NewItems",
    "UpdateConversation",
    "check_include",
    "conversation_param",
]

log = logging.getLogger(__name__)

#: Items one create or items.create call may carry (OpenAI's limit).
MAX_ITEMS = 20
#: The terminal statuses whose turn is appended to the conversation.
_APPENDED = frozenset({"completed", "incomplete"})


class CreateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[dict[str, Any]] | None = Field(
        default=None, max_length=MAX_ITEMS, json_schema_extra=ITEMS_SCHEMA
    )
    metadata: dict[str, str] | None = Field(default=None, json_schema_extra=METADATA_SCHEMA)

    _metadata = field_validator("metadata")(check_metadata)


class UpdateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, str] = Field(json_schema_extra=METADATA_SCHEMA)

    _metadata = field_validator("metadata")(check_metadata)


class NewItems(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_ITEMS, json_schema_extra=ITEMS_SCHEMA
    )


def conversation_param(value: Any, previous_response_id: str | None) -> str | None:
    """The conversation id that a ``POST /v1/responses`` body's ``conversation`` names."""
    if value is None:
        return None
    if isinstance(value, dict) and set(value) == {"id"}:
        value = value["id"]
    if not isinstance(value, str) or not value:
        raise APIError(
            400,
            "Invalid value for 'conversation': expected a conversation id or an object {\"id\": ...}.",
            param="conversation",
            code="invalid_type",
        )
    if previous_response_id is not None:
        raise APIError(
            400,
            "Mutually exclusive parameters: provide either 'previous_response_id' or "
            "'conversation', not both.",
            param="conversation",
            code="mutually_exclusive_parameters",
        )
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class ConversationTurn:
    """What a response naming a conversation appends to it when it ends."""

    conversation_id: str
    project: str
    input_items: list[dict[str, Any]]


class Conversations:
    """The conversations of every project in ``store``. ``normalize``: how a request's items
    are given ids and their listed shape (``app.prompting.normalize_input``)."""

    def __init__(
        self,
        store: EventStore,
        encoding: HarmonyEncoding,
        cipher: ReasoningCipher,
        *,
        new_id: Callable[[str], str],
        normalize: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    ) -> None:
        self._store = store
        self._encoding = encoding
        self._cipher = cipher
        self._new_id = new_id
        self._normalize = normalize

    # -- the API -----------------------------------------------------------------------------

    async def create(self, body: CreateConversation, project: str) -> dict[str, Any]:
        items = self._checked([], self._normalize(body.items or []))
        row = ConversationRow(self._new_id("conv"), project, int(time.time()), body.metadata or {})
        await self._store.conversations.create(row, items)
        return _conversation(row)

    async def retrieve(self, conversation_id: str, project: str) -> dict[str, Any]:
        return _conversation(await self._row(conversation_id, project))

    async def update(
        self, conversation_id: str, body: UpdateConversation, project: str
    ) -> dict[str, Any]:
        row = await self._store.conversations.update(conversation_id, project, body.metadata)
        if row is None:
            raise not_found("Conversation", conversation_id)
        return _conversation(row)

    async def delete(self, conversation_id: str, project: str) -> dict[str, Any]:
        if not await self._store.conversations.delete(conversation_id, project):
            raise not_found("Conversation", conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_items(
        self, conversation_id: str, body: NewItems, project: str, *, include: Sequence[str] = ()
    ) -> dict[str, Any]:
        existing = await self._items(conversation_id, project)
        items = self._checked(existing, self._normalize(body.items))
        try:
            await self._store.conversations.append(conversation_id, project, items)
        except NotFound:
            raise not_found("Conversation", conversation_id) from None
        except DuplicateItem as exc:
            position = next(i for i, item in enumerate(items) if item["id"] == exc.item_id)
            raise APIError(
                400,
                f"The conversation already has an item with id '{exc.item_id}'.",
                param=f"items[{position}].id",
                code="invalid_value",
            ) from None
        return list_page([self._included(item, include) for item in items], has_more=False)

    async def list_items(
        self,
        conversation_id: str,
        project: str,
        *,
        after: str | None,
        limit: int,
        order: str,
        include: Sequence[str] = (),
    ) -> dict[str, Any]:
        await self._row(conversation_id, project)
        try:
            items, more = await self._store.conversations.list_items(
                conversation_id,
                project,
                after=after,
                limit=limit,
                order="asc" if order == "asc" else "desc",
            )
        except NotFound:
            raise APIError(
                404,
                f"No item with id '{after}' in conversation '{conversation_id}'.",
                param="after",
            ) from None
        return list_page([self._included(item, include) for item in items], has_more=more)

    async def get_item(
        self, conversation_id: str, item_id: str, project: str, *, include: Sequence[str] = ()
    ) -> dict[str, Any]:
        try:
            item = await self._store.conversations.get_item(conversation_id, project, item_id)
        except NotFound:
            raise not_found("Conversation", conversation_id) from None
        if item is None:
            raise not_found("Item", item_id)
        return self._included(item, include)

    async def delete_item(self, conversation_id: str, item_id: str, project: str) -> dict[str, Any]:
        try:
            deleted = await self._store.conversations.delete_item(conversation_id, project, item_id)
        except NotFound:
            raise not_found("Conversation", conversation_id) from None
        if not deleted:
            raise not_found("Item", item_id)
        return await self.retrieve(conversation_id, project)  # OpenAI answers with the conversation

    # -- a response's history and its turn ---------------------------------------------------

    async def history(self, conversation_id: str, project: str) -> list[dict[str, Any]]:
        """The items a response naming the conversation is given before its input."""
        try:
            items = await self._store.conversations.items(conversation_id, project)
        except NotFound:
            raise not_found("Conversation", conversation_id, param="conversation") from None
        return [output_as_input(item) for item in items]

    async def turn_of(self, row: ResponseRow) -> ConversationTurn | None:
        """The turn a stored response owes its conversation (None if it names none): what a
        takeover continuing it on another replica appends when it ends, as its first owner
        would have."""
        # the stored request passed this check when it was created
        conversation = conversation_param(row.request.get("conversation"), None)
        if conversation is None:
            return None
        # every input item in one page (a request body's size bounds how many it has)
        items, _ = await self._store.list_input_items(
            row.id, after=None, limit=1 << 20, order="asc"
        )
        return ConversationTurn(conversation, row.project, items)

    async def record(self, turn: ConversationTurn, response_id: str, final: dict[str, Any]) -> None:
        """Append the turn of a response that ended (see the module docstring: only a
        ``completed`` or ``incomplete`` one). Called before its terminal event is written."""
        if final.get("status") not in _APPENDED:
            return
        items = [item for item in turn.input_items if item.get("type") != "item_reference"]
        items.extend(final.get("output") or [])
        while True:
            try:
                await self._store.conversations.append(
                    turn.conversation_id, turn.project, items, response_id=response_id
                )
                return
            except DuplicateItem as exc:  # an input item the conversation already holds
                items = [item for item in items if item.get("id") != exc.item_id]
            except NotFound:  # deleted while the response ran: nothing to append to
                log.warning(
                    "response %s: conversation %s was deleted; its turn is not appended",
                    response_id,
                    turn.conversation_id,
                )
                return

    # -- helpers -----------------------------------------------------------------------------

    async def _row(self, conversation_id: str, project: str) -> ConversationRow:
        row = await self._store.conversations.get(conversation_id, project)
        if row is None:
            raise not_found("Conversation", conversation_id)
        return row

    async def _items(self, conversation_id: str, project: str) -> list[dict[str, Any]]:
        try:
            return await self._store.conversations.items(conversation_id, project)
        except NotFound:
            raise not_found("Conversation", conversation_id) from None

    def _checked(
        self, existing: list[dict[str, Any]], items: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``items`` unless the conversation could not be rendered with them (400 naming
        ``items[i]...``), or a database could not hold them."""
        for position, item in enumerate(items):
            if item.get("type") == "item_reference":
                raise APIError(
                    400,
                    "An item_reference cannot be added to a conversation; add the item itself.",
                    param=f"items[{position}].type",
                    code="invalid_value",
                )
        history = [output_as_input(item) for item in existing]
        try:
            render_prompt(
                self._encoding,
                PromptRequest(
                    items=[*history, *items],
                    history_length=len(history),
                    decrypt=self._cipher.decrypt,
                    decrypt_compaction=functools.partial(self._cipher.decrypt, purpose=COMPACTION),
                ),
            )
        except InvalidInput as exc:
            param = exc.param or "items"
            if param.startswith("input"):
                param = "items" + param[len("input") :]
            raise APIError(400, exc.message, param=param, code=exc.code) from None
        try:
            for item in items:
                dump_json(item)
        except (ValueError, TypeError) as exc:
            raise APIError(
                400, f"The items cannot be stored: {exc}.", param="items", code="invalid_value"
            ) from None
        return items

    def _included(self, item: dict[str, Any], include: Sequence[str]) -> dict[str, Any]:
        """``include=reasoning.encrypted_content``: a reasoning item gets its text sealed with the
        server key (as a response made with that include has it); every other value returns the
        items as stored."""
        if (
            "reasoning.encrypted_content" in include
            and item.get("type") == "reasoning"
            and not item.get("encrypted_content")
        ):
            text = "".join(
                part.get("text", "") for part in item.get("content") or [] if isinstance(part, dict)
            )
            return {**item, "encrypted_content": self._cipher.encrypt(text)}
        return item


def check_include(values: Sequence[str]) -> list[str]:
    """``include`` of the items routes: OpenAI's values, the hosted tools' refused."""
    for i, value in enumerate(values):
        if value not in INCLUDES:
            raise APIError(
                400,
                f"Unknown include value '{value}'; OpenAI's values are: {', '.join(INCLUDES)}.",
                param=f"include[{i}]",
                code="invalid_value",
            )
        why = INCLUDES[value]
        if why is not None:
            raise APIError(
                400,
                f"include '{value}' is not supported: {why}.",
                param=f"include[{i}]",
                code="unsupported_value",
            )
    return list(values)


def _conversation(row: ConversationRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "conversation",
        "created_at": row.created_at,
        "metadata": row.metadata,
    }

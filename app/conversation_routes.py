"""HTTP routes of the Conversations API (``/v1/conversations``), registered by ``app.http``.

Every route is scoped by the caller's project in the store's own queries
(``persistence.conversations``): another project's conversation answers exactly what a missing
one does. Writes are refused at once (503, Retry-After) while the database cannot take them.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.body import json_body
from app.conversations import (
    Conversations,
    CreateConversation,
    NewItems,
    UpdateConversation,
    check_include,
)
from app.errors import APIError, guard, not_found
from app.ownership import caller_of

__all__ = ["routes"]

#: Longer path ids cannot exist (ours are 53 characters); see ``app.http``.
_MAX_ID = 256
_INTEGER = re.compile(r"-?[0-9]{1,20}")


def _conversations(request: Request) -> Conversations:
    conversations: Conversations = request.app.state.service.conversations
    return conversations


def _path_id(request: Request, name: str, what: str) -> str:
    ident: str = request.path_params[name]
    if len(ident) > _MAX_ID or not ident.isprintable():
        shown = ascii(ident)[1:-1]
        raise not_found(what, shown[:_MAX_ID])
    return ident


def _conversation_id(request: Request) -> str:
    return _path_id(request, "conversation_id", "Conversation")


def _item_id(request: Request) -> str:
    return _path_id(request, "item_id", "Item")


def _writable(request: Request) -> None:
    request.app.state.service.check_writable()


async def _body(request: Request) -> dict[str, Any]:
    return await json_body(request, request.app.state.service.settings.max_body_bytes)


def _include(request: Request) -> list[str]:
    return check_include(
        [*request.query_params.getlist("include"), *request.query_params.getlist("include[]")]
    )


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None or raw == "":
        return 20
    if _INTEGER.fullmatch(raw) is None or not 1 <= int(raw) <= 100:
        raise APIError(
            400,
            "Invalid value for 'limit': expected an integer between 1 and 100.",
            param="limit",
            code="invalid_value",
        )
    return int(raw)


async def create_conversation(request: Request) -> Response:
    _writable(request)
    body = CreateConversation.model_validate(await _body(request))
    return JSONResponse(await _conversations(request).create(body, caller_of(request).project))


async def retrieve_conversation(request: Request) -> Response:
    conversation_id = _conversation_id(request)
    return JSONResponse(
        await _conversations(request).retrieve(conversation_id, caller_of(request).project)
    )


async def update_conversation(request: Request) -> Response:
    conversation_id = _conversation_id(request)
    _writable(request)
    body = UpdateConversation.model_validate(await _body(request))
    return JSONResponse(
        await _conversations(request).update(conversation_id, body, caller_of(request).project)
    )


async def delete_conversation(request: Request) -> Response:
    conversation_id = _conversation_id(request)
    _writable(request)
    return JSONResponse(
        await _conversations(request).delete(conversation_id, caller_of(request).project)
    )


async def create_items(request: Request) -> Response:
    conversation_id = _conversation_id(request)
    include = _include(request)
    _writable(request)
    body = NewItems.model_validate(await _body(request))
    return JSONResponse(
        await _conversations(request).add_items(
            conversation_id, body, caller_of(request).project, include=include
        )
    )


async def list_items(request: Request) -> Response:
    conversation_id = _conversation_id(request)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(
            400,
            "Invalid value for 'order': expected 'asc' or 'desc'.",
            param="order",
            code="invalid_value",
        )
    after = request.query_params.get("after") or None
    return JSONResponse(
        await _conversations(request).list_items(
            conversation_id,
            caller_of(request).project,
            after=after,
            limit=_limit(request),
            order=order,
            include=_include(request),
        )
    )


async def retrieve_item(request: Request) -> Response:
    conversation_id, item_id = _conversation_id(request), _item_id(request)
    return JSONResponse(
        await _conversations(request).get_item(
            conversation_id, item_id, caller_of(request).project, include=_include(request)
        )
    )


async def delete_item(request: Request) -> Response:
    conversation_id, item_id = _conversation_id(request), _item_id(request)
    _writable(request)
    return JSONResponse(
        await _conversations(request).delete_item(
            conversation_id, item_id, caller_of(request).project
        )
    )


_ONE = "/v1/conversations/{conversation_id}"
routes = [
    Route("/v1/conversations", guard(create_conversation), methods=["POST"]),
    Route(_ONE, guard(retrieve_conversation), methods=["GET"]),
    Route(_ONE, guard(update_conversation), methods=["POST"]),
    Route(_ONE, guard(delete_conversation), methods=["DELETE"]),
    Route(_ONE + "/items", guard(create_items), methods=["POST"]),
    Route(_ONE + "/items", guard(list_items), methods=["GET"]),
    Route(_ONE + "/items/{item_id}", guard(retrieve_item), methods=["GET"]),
    Route(_ONE + "/items/{item_id}", guard(delete_item), methods=["DELETE"]),
]

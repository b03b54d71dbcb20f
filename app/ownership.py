"""Project scoping: a caller sees only its own project's responses.

Every route that names a response (``/v1/responses/{response_id}...``) is wrapped by
:func:`scoped`, which reads the response's row and answers 404 when it belongs to another
project, with exactly the error a missing response gets: an id from elsewhere tells its holder
nothing, not even that it exists. Admins may also read the audit endpoint (``/events``) of any
project. The check sits here, one hop from the routes, so ``ResponseService`` stays unaware of
callers; what it is given is the caller's project for the writes and chains it makes
(``previous_response_id`` is followed only through the caller's project,
``EventStore.load_chain(..., project=)``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.errors import not_found
from app.keys import Caller
from app.limits import CALLER

__all__ = ["caller_of", "scoped"]

Handler = Callable[[Request], Awaitable[Response]]


def caller_of(request: Request) -> Caller:
    """The caller ``app.auth.KeyAuth`` found (a KeyError, never a default, if it did not run)."""
    caller: Caller = request.scope[CALLER]
    return caller


def scoped(handler: Handler, *, audit: bool = False) -> Handler:
    """``handler`` for the caller's own responses only; others' are 404 as if missing."""

    async def route(request: Request) -> Response:
        caller = caller_of(request)
        response_id = request.path_params["response_id"]
        store: Any = request.app.state.service.store
        row = await store.get(response_id)
        if row is None or not caller.may_read(row.project, audit=audit):
            raise not_found("Response", response_id)
        return await handler(request)

    route.__name__ = getattr(handler, "__name__", "route")
    return route

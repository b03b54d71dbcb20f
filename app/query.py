"""Query parameters: an operation takes the ones its OpenAPI description lists, and no other.

A name the route does not know was ignored before: ``GET /v1/responses/{id}?stream=true&
starting_afer=5`` (a typo) replayed the whole log as if nothing had been asked, and ``POST
/v1/responses?stream=true`` answered JSON. As a body's unknown field is OpenAI's 400
``unknown_parameter``, so is a query's now, before the route runs: the names each operation
takes are :data:`app.openapi.OPERATIONS`' (the document ``/openapi.json`` serves), so what is
documented and what is accepted cannot drift apart. Also refused:

- a parameter that takes one value, given more than once (``limit=5&limit=50``: which one
  was meant?); a list (``include``) may repeat, spelled ``include`` or ``include[]`` (the
  OpenAI SDK's form);
- a parameter OpenAI's API takes that the operation refuses (``Query.refused``: ``include`` on
  a read of a response), with its reason.

Their values are the routes' to check (``app.http``, ``app.conversation_routes``). The audit
page's routes, outside the document (HTML for people), say what they take in ``app.ui.QUERIES``
(a filter misspelt in the address, ``/ui?from=...`` for ``since``, showed every response). The
WebSocket on ``/v1/responses`` (``app.websocket``, which OpenAPI cannot describe) takes none: an
upgrade with a query is refused as its HTTP request would be (``app.auth.refuse_upgrade``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from starlette.datastructures import QueryParams
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth import refuse_upgrade
from app.errors import APIError, error_body, unknown_parameter
from app.openapi import OPERATIONS, Operation, Query, path_template

__all__ = ["QueryParameters"]


class _Taken:
    """The query parameters one route takes: each name, whether it is a list, and why it is
    refused (built once a route, when the middleware is)."""

    __slots__ = ("lists", "refused", "scalars")

    def __init__(self, queries: Sequence[Query]) -> None:
        self.scalars: set[str] = set()
        self.lists: set[str] = set()
        self.refused: dict[str, str] = {}
        for query in queries:
            if query.refused is not None:
                self.refused[query.name] = query.refused
            elif query.schema.get("type") == "array":
                self.lists.add(query.name)
            else:
                self.scalars.add(query.name)

    def refusal(self, items: Iterable[tuple[str, str]]) -> APIError | None:
        """The 400 for the first of ``items`` (the query's names and values, in order, repeats
        included) that this route does not take; None when it takes them all."""
        seen: set[str] = set()
        for given, _ in items:
            name = given[:-2] if given.endswith("[]") else given
            if name in self.refused:
                return APIError(
                    400, f"'{given}' {self.refused[name]}", param=name, code="invalid_value"
                )
            if name in self.lists:
                continue
            if given not in self.scalars:
                return unknown_parameter(given)
            if given in seen:
                return APIError(
                    400,
                    f"Invalid value for '{given}': it is given more than once; give it once.",
                    param=given,
                    code="invalid_value",
                )
            seen.add(given)
        return None


_NOTHING = _Taken(())


class QueryParameters:
    """Middleware: answers a request whose query the matched route does not take with the
    400 of :meth:`_Taken.refusal`, before the route runs. ``routes``: the app's (matched as the
    router matches them); ``operations``: what each ``(method, path)`` takes; ``pages``: what
    each GET route outside the document takes, by path."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Iterable[BaseRoute],
        operations: Mapping[tuple[str, str], Operation] = OPERATIONS,
        pages: Mapping[str, Sequence[Query]] | None = None,
    ) -> None:
        self.app = app
        routes, pages = list(routes), pages or {}
        self._sockets = [r for r in routes if isinstance(r, WebSocketRoute)]
        # each HTTP route with what it takes by method (HEAD: its GET's); one that says nothing
        # of its query is left out
        self._routes: list[tuple[Route, dict[str, _Taken]]] = []
        for route in (r for r in routes if isinstance(r, Route)):
            path = path_template(route.path)
            taken = {
                method: _Taken(operations[method, path].query)
                for method in route.methods or ()
                if (method, path) in operations
            }
            if not taken and path in pages:
                taken = {"GET": _Taken(pages[path])}
            if "GET" in taken:
                taken["HEAD"] = taken["GET"]
            self._routes.append((route, taken))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("query_string"):
            taken = self._taken(scope)
            if taken is not None:
                error = taken.refusal(QueryParams(scope["query_string"]).multi_items())
                if error is not None and scope["type"] == "websocket":
                    await refuse_upgrade(scope, receive, send, error)
                    return
                if error is not None:
                    answer = JSONResponse(
                        error_body(error.message, error.type, error.param, error.code),
                        status_code=error.status,
                    )
                    await answer(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _taken(self, scope: Scope) -> _Taken | None:
        """What the route the router will run for ``scope`` takes (None: no such route, or one
        that says nothing of its query); a WebSocket route takes nothing."""
        if scope["type"] == "websocket":
            matched = any(r.matches(scope)[0] is Match.FULL for r in self._sockets)
            return _NOTHING if matched else None
        if scope["type"] != "http":
            return None
        for route, taken in self._routes:
            if route.matches(scope)[0] is Match.FULL:
                return taken.get(scope["method"])
        return None

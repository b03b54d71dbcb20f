"""``Authorization: Bearer KEY`` on every ``/v1`` route, as an ASGI middleware.

A request (or WebSocket upgrade, ``app.websocket``) to ``/v1`` without a valid key is answered
401 with OpenAI's error (``type`` ``invalid_request_error``, ``code`` ``invalid_api_key``) and a
``WWW-Authenticate`` header;
the message never repeats the key. A valid key's :class:`~app.keys.Caller` is put in the scope
for the routes (``app.ownership``, ``app.limits``), its rate is counted (429 over it), and the
stream slots the route took are given back when the exchange ends.

A server that does not require keys (loopback, none configured: ``make serve``) serves every
request as :data:`~app.keys.OPEN_CALLER`, the default project. ``/health`` needs no key;
``/metrics`` does (an admin's: the route checks the role).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import APIError, error_body, handle_exception, to_api_error
from app.keys import OPEN_CALLER, Caller, KeyRing
from app.limits import CALLER, RELEASE, KeyLimits
from app.logs import request_id_headers
from persistence.errors import StoreError

__all__ = ["KeyAuth", "refuse_upgrade", "serve_as"]

_BEARER = b"bearer "


class KeyAuth:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not _guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        ring: KeyRing | None = getattr(state, "keys", None)
        if ring is None:  # still starting: no one is let in before the keys are known
            await _answer(
                scope, receive, send, APIError(503, "The server is starting.", type="server_error")
            )
            return
        caller: Caller = OPEN_CALLER
        if ring.required:
            presented = _bearer(scope)
            found: Caller | None = None
            if presented:
                try:
                    found = await ring.authenticate(presented)
                except StoreError as exc:
                    await _answer(scope, receive, send, exc)
                    return
            if found is None:
                metrics = getattr(state, "metrics", None)
                if metrics is not None and metrics.enabled:
                    metrics.auth_failures.labels("invalid" if presented else "missing").inc()
                await _answer(scope, receive, send, _unauthorized(presented is not None))
                return
            caller = found
        limits: KeyLimits = state.limits
        refused = limits.admit(caller)
        if refused is not None:
            await _answer(scope, receive, send, refused)
            return
        await serve_as(caller, self.app, scope, receive, send)


async def serve_as(
    caller: Caller, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Run ``app`` for ``caller``: put in the scope for the routes (``app.limits.CALLER``), with
    the releases its streams register (``RELEASE``: their slots) run when it is done."""
    releases: list[Callable[[], None]] = []
    scope[CALLER] = caller
    scope[RELEASE] = releases
    try:
        await app(scope, receive, send)
    finally:
        for release in releases:
            release()


def _guarded(path: str) -> bool:
    """The paths that need a key: the API, and the metrics (admins only, ``app.metrics``)."""
    return path.startswith("/v1") or path == "/metrics"


def _bearer(scope: Scope) -> str | None:
    """The key of an ``Authorization: Bearer`` header; "" for another or empty one; None
    without the header."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            raw: bytes = value
            if raw[:7].lower() != _BEARER:
                return ""
            return raw[7:].strip().decode("latin-1")
    return None


def _unauthorized(presented: bool) -> APIError:
    message = (
        "Incorrect API key provided. You can find your API key with `responses-ledger keys list`."
        if presented
        else "You didn't provide an API key. You need to provide your API key in an Authorization "
        "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
    )
    return APIError(
        401,
        message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": 'Bearer realm="responses-ledger"'},
    )


async def _answer(scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
    if scope["type"] == "websocket":
        await refuse_upgrade(scope, receive, send, to_api_error(exc))
        return
    response: Any = await handle_exception(Request(scope, receive), exc)
    await response(scope, receive, send)


async def refuse_upgrade(scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
    """A WebSocket upgrade refused as its HTTP request would be: the same status, headers and
    JSON error (the ASGI denial response, which uvicorn serves). A server without it gets the
    socket accepted, the error as an ``error`` message, and a close with code 1008."""
    body = error_body(err.message, err.type, err.param, err.code)
    stamp = request_id_headers(scope)
    if "websocket.http.response" in scope.get("extensions", {}):
        headers = {**(err.headers or {}), **{k.decode(): v.decode() for k, v in stamp}}
        await JSONResponse(body, status_code=err.status, headers=headers)(scope, receive, send)
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept", "headers": stamp})
    event = {"type": "error", "status": err.status, "error": body["error"]}
    await send({"type": "websocket.send", "text": json.dumps(event)})
    await send({"type": "websocket.close", "code": 1008, "reason": err.message[:120]})

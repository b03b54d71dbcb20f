"""Protections against a browser being used against the server: an ASGI middleware.

A server on localhost is reachable from every web page its user opens. Three checks close the
ways in, before any route (or key check) runs:

- **JSON bodies only with ``Content-Type: application/json``** (415 otherwise). A page can send
  a cross-origin ``text/plain`` (or form) POST without asking the browser first (a "simple"
  request, no CORS preflight); an ``application/json`` one needs a preflight, which is refused
  unless CORS allows the page's origin. So the blind cross-site POST never reaches a route.
- **A Host allow-list** (400 otherwise): DNS rebinding points a page's own name at 127.0.0.1,
  after which the browser treats the server as same-origin, but it still sends the page's name
  as ``Host``. The default, when bound to loopback, is the loopback names only; bound
  elsewhere, any name (keys are required there); ``RESPONSES_LEDGER_ALLOWED_HOSTS`` sets it.
- **CORS off by default**: no ``Access-Control-*`` headers, and a request that carries an
  ``Origin`` header other than an allowed one is refused (403): browsers send ``Origin`` on
  every cross-origin request and on same-origin POSTs, and no page is served from here.
  ``RESPONSES_LEDGER_CORS_ORIGINS`` names the origins a browser may call from (Starlette's
  ``CORSMiddleware`` then answers their preflights and adds the headers).

WebSocket upgrades (``app.websocket``) get the Host and Origin checks too: a page may open a
WebSocket to any origin without CORS, and the browser sends its ``Origin`` with the upgrade.

Clients that are not browsers (the OpenAI SDKs, curl, Codex) send JSON with its content type,
their own ``Host`` and no ``Origin``: none of this changes anything for them.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth import refuse_upgrade
from app.errors import APIError, handle_exception
from app.keys import is_loopback

__all__ = ["LOOPBACK_NAMES", "BrowserGuard", "allowed_hosts"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def allowed_hosts(configured: tuple[str, ...], bind_host: str) -> tuple[str, ...] | None:
    """The Host names to accept (None: any)."""
    if configured:
        return None if "*" in configured else tuple(name.lower() for name in configured)
    return LOOPBACK_NAMES if is_loopback(bind_host) else None


class BrowserGuard:
    def __init__(
        self, app: ASGIApp, *, hosts: tuple[str, ...] | None, origins: tuple[str, ...]
    ) -> None:
        self.app = app
        self._hosts = None if hosts is None else frozenset(hosts)
        self._origins = frozenset(origins)
        self._any_origin = "*" in origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._check(scope)
        if refusal is not None:
            if scope["type"] == "websocket":  # refused as its upgrade request (app.auth)
                await refuse_upgrade(scope, receive, send, refusal)
                return
            response = await handle_exception(Request(scope, receive), refusal)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> APIError | None:
        host = origin = content_type = length = chunked = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = value
        if self._hosts is not None and _host_name(host) not in self._hosts:
            return APIError(
                400,
                "The Host header names a host this server does not answer to "
                "(see RESPONSES_LEDGER_ALLOWED_HOSTS).",
                code="invalid_host",
            )
        if (
            origin is not None
            and not self._any_origin
            and origin.decode("latin-1") not in self._origins
        ):
            return APIError(
                403,
                "Requests from this origin are not allowed (see RESPONSES_LEDGER_CORS_ORIGINS).",
                type="permission_error",
                code="origin_not_allowed",
            )
        has_body = chunked is not None or (length is not None and length.strip() not in (b"", b"0"))
        if (
            scope["type"] == "http"
            and scope["method"] in _BODY_METHODS
            and has_body
            and not _is_json(content_type)
        ):
            return APIError(
                415,
                "The request body must be JSON, sent with 'Content-Type: application/json'.",
                code="unsupported_media_type",
            )
        return None


def _host_name(header: bytes | None) -> str | None:
    """The name of a Host header, without the port; IPv6 without its brackets."""
    if header is None:
        return None
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        end = text.find("]")
        return text[1:end] if end > 0 else None
    return text.rsplit(":", 1)[0] if ":" in text else text


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json"

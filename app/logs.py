"""Structured logs: JSON lines, and one line per HTTP request.

``configure`` installs the format (``RESPONSES_LEDGER_LOG_FORMAT``: ``json``, the default, one
JSON object a line; or ``text``) and the level (``RESPONSES_LEDGER_LOG_LEVEL``) on the root
logger, for everything the process logs (uvicorn's lines too, under ``responses-ledger serve``).

:class:`RequestLog` writes one line per request when its exchange ends (a stream: when it
ends; health checks and scrapes at DEBUG), logger ``app.requests``: method, path, HTTP status,
duration, the caller's project and key id, and for a response its id, model, status, token
counts and time to its first byte; and ``request_id``, which every HTTP answer (a WebSocket
upgrade's too) carries as its ``x-request-id`` header, as OpenAI's do (``req_`` and 48 hex digits, ``app.ids``): the OpenAI SDK
shows it on its errors (``APIStatusError.request_id``) and responses (``_request_id``), so a
client's report finds its line. A
request that failed (HTTP 5xx, or a response that ended ``failed``) is logged at ERROR with the
response id and the error's code and message.

What never reaches a log: keys (the caller carries only the key's id), request bodies, prompt
and output text. The query string is left out (only the parameters' names are kept), and a
failed response's message is the server's or the engine's, never the model's text.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import LOG_LEVELS

from app.ids import new_id
from app.limits import CALLER

__all__ = ["REQUEST_ID", "RUN", "JsonFormatter", "RequestLog", "configure", "request_id_headers"]

#: Where ``POST /v1/responses`` leaves its run for the request's log line.
RUN = "ledger.run"
#: A WebSocket upgrade's request id, its answer's ``x-request-id`` (set by ``RequestLog``).
REQUEST_ID = "ledger.request_id"

_requests = logging.getLogger("app.requests")
_PROBES = ("/health", "/metrics")
#: LogRecord attributes that are not a caller's ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's message again, with terminal colours
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (Unix seconds), ``level``, ``logger``, ``message``,
    the record's ``extra`` fields, and ``exception`` (its traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """The root logger's one handler (stderr), in ``fmt`` (``json`` or ``text``), at ``level``."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LOG_LEVELS[level.lower()])  # (uvicorn's names: its ``trace`` is below debug)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # into the same handler
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


class RequestLog:
    """ASGI middleware: the line per request, and each answer's ``x-request-id`` (see the
    module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":  # its upgrade's answer carries the id (request_id_headers)
            scope[REQUEST_ID] = new_id("req")
        if kind != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_id("req")
        header = (b"x-request-id", request_id.encode())
        started = time.perf_counter()
        seen: dict[str, float] = {}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
                seen["status"] = message["status"]
                seen["first_byte"] = time.perf_counter()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if _requests.isEnabledFor(logging.ERROR):
                _log_request(scope, seen, started, request_id)


def request_id_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The ``x-request-id`` header of a WebSocket upgrade's answer, for whoever answers it
    (``app.websocket``'s accept, ``app.auth.refuse_upgrade``): its ``send`` is not wrapped as
    an HTTP request's is, so no message of the socket's pays for the header."""
    request_id = scope.get(REQUEST_ID)
    return [(b"x-request-id", request_id.encode())] if request_id else []


def _log_request(scope: Scope, seen: dict[str, float], started: float, request_id: str) -> None:
    status = int(seen.get("status", 500))
    line: dict[str, Any] = {
        "event": "request",
        "request_id": request_id,
        "method": scope["method"],
        "path": scope["path"],
        "http_status": status,
        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
    }
    if "first_byte" in seen:
        line["first_byte_ms"] = round((seen["first_byte"] - started) * 1000, 3)
    query = scope.get("query_string", b"")
    if query:  # names only: values may be anything a client typed
        line["query"] = sorted(
            {part.split(b"=")[0].decode("latin-1") for part in query.split(b"&")}
        )
    caller = scope.get(CALLER)
    if caller is not None:
        line["project"] = caller.project
        line["key_id"] = caller.key_id
    response_id = scope.get("path_params", {}).get("response_id")
    if response_id is not None:
        line["response_id"] = response_id
    run = scope.get(RUN)
    level = logging.ERROR if status >= 500 else logging.INFO
    if status < 500 and scope["path"].startswith(_PROBES):
        level = logging.DEBUG  # a balancer's health checks, twice a second: not news
    if run is not None:
        line["response_id"] = run.id
        line["model"] = run.model
        response = run.final_response or run.created_response
        if response is not None:
            line["status"] = response.get("status")
            usage = response.get("usage") or {}
            if usage:
                line["input_tokens"] = usage.get("input_tokens")
                line["output_tokens"] = usage.get("output_tokens")
            error = response.get("error")
            if error:
                level = logging.ERROR
                line["error_code"] = error.get("code")
                line["error"] = error.get("message")
        elif run.error is not None:
            level = logging.ERROR
            line["error"] = type(run.error).__name__
    if not _requests.isEnabledFor(level):
        return
    message = f"{line['method']} {line['path']} {status}"
    if "response_id" in line:
        message += f" {line['response_id']}"
    _requests.log(level, message, extra=line)

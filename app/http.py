"""HTTP routes: ``/v1/responses`` and friends, over Starlette and sse-starlette.

Streams are written as pre-built SSE bytes: each chunk handed to sse-starlette is every frame that
one commit made durable, so a connection costs one socket write per commit, not one per token.
sse-starlette passes ``bytes`` through untouched and adds keep-alive comments on idle streams.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app import transport
from app.errors import APIError
from app.limits import take_stream
from app.live import Run
from app.ownership import caller_of, scoped
from app.service import ResponseService
from app.wire import CreateResponse
from persistence.errors import StoreUnavailable

__all__ = ["routes"]

log = logging.getLogger(__name__)


def _service(request: Request) -> ResponseService:
    service: ResponseService = request.app.state.service
    return service


async def _json_body(request: Request) -> dict[str, Any]:
    limit = _service(request).settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise APIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    if b"\\u0000" in raw and _has_nul(body):  # the cheap test first; it can over-match
        raise APIError(
            400, "The request contains a NUL character (\\u0000), which cannot be stored.",
            code="invalid_value",
        )
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    return body


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


class _EventStream(EventSourceResponse):
    """sse-starlette (pinned 3.7.0) wraps every chunk's send in an anyio cancel scope for its
    optional per-send timeout. We set no such timeout, and when an engine paces tokens slowly
    every token is its own chunk, so the scope was a measurable part of each token's cost: without
    a timeout the chunk is sent directly.

    A stuck client is handled by the transport (``app.transport``): a connection whose client
    reads nothing for ``send_stall_s`` is closed. A ``live`` stream (the creating POST's: every
    batch it sends is published to it whether it sends or not, so while its send waits they pile
    up in its subscription) does not wait for its client at all: it sends through
    ``transport.bounded_send``, which queues up to ``send_buffer_bytes`` in the transport and
    closes the connection beyond that; the disconnect ends the stream and its subscription."""

    def __init__(self, *args: Any, live: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.live = live

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await super().__call__(scope, receive, transport.bounded_send(scope, send) if self.live else send)

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


def _sse(frames: AsyncIterator[bytes], *, live: bool = False) -> EventSourceResponse:
    return _EventStream(frames, ping=15, headers={"Cache-Control": "no-cache"}, live=live)


async def create_response(request: Request) -> Response:
    service = _service(request)
    body = await _json_body(request)
    create = CreateResponse.model_validate(body)  # ValidationError -> 400 in app.errors
    if create.stream:
        take_stream(request)  # 429 when the key has all its streams open
    caller = caller_of(request)
    run = await service.create(create, body, project=caller.project, api_key_id=caller.key_id)
    if create.stream or create.background:
        # Answer once response.created is durable: a store that cannot take the response gets
        # an error status, not a 200 (a stream that ends without events, or the id of a
        # background response that does not exist).
        await run.created.wait()
        if not run.published:
            raise _run_failure(run, "The response could not be stored.")
        if create.stream:
            return _sse(_live_stream(service, run), live=True)
        return JSONResponse(run.created_response)
    await run.finished.wait()
    if run.final_response is None:
        raise _run_failure(run, f"The response {run.id} could not be completed.")
    return JSONResponse(run.final_response)


def _run_failure(run: Run, message: str) -> Exception:
    """What a POST answers when its run stopped before the answer could be given: the
    database's unavailability (503, Retry-After) if that was it, else a plain 500."""
    if isinstance(run.error, StoreUnavailable):
        return run.error
    return APIError(500, message, type="server_error")


async def _live_stream(service: ResponseService, run: Run) -> AsyncIterator[bytes]:
    finished = False
    try:
        async for chunk in service.stream(run.id, -1, run=run, queue=run.first_queue):
            yield chunk
        finished = True
    finally:
        if not finished and not run.store:
            await service.abort_unread(run)


def _int_param(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise APIError(400, f"Invalid value for '{name}': expected an integer.", param=name, code="invalid_value") from None
    if not lo <= value <= hi:
        raise APIError(400, f"Invalid value for '{name}': must be between {lo} and {hi}.", param=name, code="invalid_value")
    return value


async def get_response(request: Request) -> Response:
    service = _service(request)
    response_id = request.path_params["response_id"]
    if request.query_params.get("stream", "").lower() in ("true", "1"):
        after = _int_param(request, "starting_after", -1, -1, 2**62)
        if await service.store.get(response_id) is None:
            raise APIError(404, f"Response with id '{response_id}' not found.")
        take_stream(request)
        return _sse(service.stream(response_id, after if after is not None else -1))
    return JSONResponse(await service.get(response_id))


async def delete_response(request: Request) -> Response:
    return JSONResponse(await _service(request).delete(request.path_params["response_id"]))


async def cancel_response(request: Request) -> Response:
    return JSONResponse(await _service(request).cancel(request.path_params["response_id"]))


async def list_input_items(request: Request) -> Response:
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
    limit = _int_param(request, "limit", 20, 1, 100)
    return JSONResponse(
        await _service(request).input_items(
            request.path_params["response_id"],
            after=request.query_params.get("after") or None,
            limit=limit or 20,
            order=order,
        )
    )


async def list_events(request: Request) -> Response:
    return JSONResponse(await _service(request).events(request.path_params["response_id"]))


async def list_models(request: Request) -> Response:
    service = _service(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "responses-ledger"}
                for name in service.model_names()
            ],
        }
    )


async def health(request: Request) -> Response:
    """200 ``{"status": "ok"}`` when the server can take requests; otherwise 503 with the
    ``reason`` (starting, engine down, database unavailable or read-only)."""
    state = request.app.state
    reason: str | None = None
    if not getattr(state, "ready", False):
        reason = "starting"
    else:
        service = _service(request)
        if not service.engine.healthy():
            reason = "the engine is not healthy"
        elif service.store.health.failing:
            reason = f"the database cannot be written: {service.store.health.reason}"
    if reason is None:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)


routes = [
    Route("/v1/responses", create_response, methods=["POST"]),
    # scoped: another project's response is 404, exactly like a missing one (app.ownership)
    Route("/v1/responses/{response_id}", scoped(get_response), methods=["GET"]),
    Route("/v1/responses/{response_id}", scoped(delete_response), methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", scoped(cancel_response), methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", scoped(list_input_items), methods=["GET"]),
    Route("/v1/responses/{response_id}/events", scoped(list_events, audit=True), methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]

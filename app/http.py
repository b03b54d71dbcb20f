"""HTTP routes: ``/v1/responses`` and friends, over Starlette and sse-starlette.

Streams are written as pre-built SSE bytes: each chunk is every frame that one commit made
durable, so a connection costs one socket write per commit, not one per token. ``app.sse``'s
``EventStream`` (sse-starlette's response without its task group) owns the response (its start,
keep-alive comments on idle streams, the client's disconnect, shutdown, the end) and passes
``bytes`` through untouched. A creating POST's live stream sends only its first
and last chunks through it: the chunks between are written to the connection by the commits
that make them durable (``_live_stream``, ``transport.body_writer``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from app import input_tokens, openapi, transport
from app.body import json_body
from app.contract import check_request
from app.conversation_routes import routes as conversation_routes
from app.errors import APIError, guard, not_found
from app.limits import take_stream
from app.live import Run
from app.logs import RUN
from app.metrics import CONTENT_TYPE, Metrics
from app.ownership import caller_of, scoped
from app.service import ResponseService, model_not_found
from app.sse import EventStream
from app.ui import routes as ui_routes
from app.websocket import routes as websocket_routes
from app.wire import CreateResponse
from persistence.errors import StoreUnavailable

__all__ = ["route_error", "routes"]

log = logging.getLogger(__name__)


def _service(request: Request) -> ResponseService:
    service: ResponseService = request.app.state.service
    return service


#: Longer path ids cannot exist (ours are 53 characters); such an id is a 404 without asking the
#: store (PostgreSQL refuses a NUL in a string outright: that was a 500).
_MAX_ID = 256


def _response_id(request: Request) -> str:
    """The ``{response_id}`` of the path; one that cannot exist (not printable: a NUL, a control
    character; or longer than 256 characters) is answered 404 exactly like an unknown one."""
    ident: str = request.path_params["response_id"]
    if len(ident) > _MAX_ID or not ident.isprintable():
        shown = ascii(ident)[1:-1]
        raise not_found("Response", shown if len(shown) <= _MAX_ID else shown[:_MAX_ID] + "...")
    return ident


async def create_response(request: Request) -> Response:
    service = _service(request)
    body = await json_body(request, service.settings.max_body_bytes)
    check_request(body)  # what the server cannot honour is a 400 naming it (app.contract)
    create = CreateResponse.model_validate(body)  # ValidationError -> 400 in app.errors
    if create.stream:
        take_stream(request)  # 429 when the key has all its streams open
    caller = caller_of(request)
    run = await service.create(create, body, project=caller.project, api_key_id=caller.key_id)
    request.scope[RUN] = run  # for the request's log line (app.logs)
    if create.stream or create.background:
        # Answer once response.created is durable: a store that cannot take the response gets
        # an error status, not a 200 (a stream that ends without events, or the id of a
        # background response that does not exist).
        await run.created.wait()
        if not run.published:
            raise _run_failure(run, "The response could not be stored.")
        if create.stream:
            return EventStream(_live_stream(service, run, request.scope), live=True)
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


async def _live_stream(service: ResponseService, run: Run, scope: Any) -> AsyncIterator[bytes]:
    """The creating request's stream. After its first batch, its frames are written to the
    connection by the commits that make them durable (``transport.body_writer``), not sent by
    this generator through sse-starlette and the middleware: a token then costs no task switch
    and no ``send`` chain. The first batch and the last (the terminal event, or the ``error``
    that ends a stream none can end) still come through here."""
    finished = False
    try:
        direct = functools.partial(transport.body_writer, scope)
        async for chunk in service.stream(
            run.id, -1, run=run, queue=run.first_queue, direct=direct
        ):
            yield chunk
        finished = True
    finally:
        if not finished and not run.store:
            await service.abort_unread(run)


_INTEGER = re.compile(r"-?[0-9]{1,20}")


def _int_param(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if _INTEGER.fullmatch(raw) is None:  # int() also takes " 5", "1_0" and other scripts' digits
        raise APIError(
            400,
            f"Invalid value for '{name}': expected an integer.",
            param=name,
            code="invalid_value",
        )
    value = int(raw)
    if not lo <= value <= hi:
        raise APIError(
            400,
            f"Invalid value for '{name}': must be between {lo} and {hi}.",
            param=name,
            code="invalid_value",
        )
    return value


def _bool_param(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "").lower()
    if raw in ("true", "1"):
        return True
    if raw in ("", "false", "0"):
        return False
    raise APIError(
        400,
        f"Invalid value for '{name}': expected 'true' or 'false'.",
        param=name,
        code="invalid_value",
    )


async def get_response(request: Request) -> Response:
    service = _service(request)
    response_id = _response_id(request)
    stream = _bool_param(request, "stream")
    _bool_param(request, "include_obfuscation")  # (a hint: no obfuscation field is ever added)
    after = _int_param(request, "starting_after", -1, -1, 2**62)
    if not stream and request.query_params.get("starting_after"):
        raise APIError(
            400,
            "'starting_after' is only used with stream=true.",
            param="starting_after",
            code="invalid_value",
        )
    if stream:
        if await service.store.get(response_id) is None:
            raise APIError(404, f"Response with id '{response_id}' not found.")
        take_stream(request)
        if service.metrics.enabled:
            service.metrics.resumes.inc()
        return EventStream(service.stream(response_id, after if after is not None else -1))
    return JSONResponse(await service.get(response_id))


async def delete_response(request: Request) -> Response:
    return JSONResponse(await _service(request).delete(_response_id(request)))


async def cancel_response(request: Request) -> Response:
    return JSONResponse(await _service(request).cancel(_response_id(request)))


async def list_input_items(request: Request) -> Response:
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(
            400,
            "Invalid value for 'order': expected 'asc' or 'desc'.",
            param="order",
            code="invalid_value",
        )
    limit = _int_param(request, "limit", 20, 1, 100)
    response_id = _response_id(request)
    after = request.query_params.get("after") or None
    if after is not None and "\x00" in after:  # no stored item id holds one (bodies cannot)
        if await _service(request).store.get(response_id) is None:
            raise not_found("Response", response_id)
        raise APIError(404, f"no input item {after!r} in response {response_id!r}")
    return JSONResponse(
        await _service(request).input_items(
            response_id,
            after=after,
            limit=limit or 20,
            order=order,
        )
    )


async def list_events(request: Request) -> Response:
    return JSONResponse(await _service(request).events(_response_id(request)))


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "responses-ledger"}


async def list_models(request: Request) -> Response:
    service = _service(request)
    return JSONResponse({"object": "list", "data": [_model(n) for n in service.model_names()]})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{model}`` (the SDK's ``models.retrieve``): a served name or an alias, as
    the list shows it; any other name is the 404 a request naming it gets. A name may hold a
    ``/`` (``openai/gpt-oss-20b``, a Hugging Face id), sent as it is or as ``%2F``."""
    name: str = request.path_params["model"]
    service = _service(request)
    if name not in service.model_names():
        raise model_not_found(name)
    return JSONResponse(_model(name))


async def count_input_tokens(request: Request) -> Response:
    service = _service(request)
    body = await json_body(request, service.settings.max_body_bytes)
    return JSONResponse(await input_tokens.count(service, body, project=caller_of(request).project))


async def compact_response(request: Request) -> Response:
    """``POST /v1/responses/compact`` (``app.compaction``)."""
    service = _service(request)
    body = await json_body(request, service.settings.max_body_bytes)
    return JSONResponse(await service.compactions.compact(body, project=caller_of(request).project))


async def unknown_action(request: Request) -> Response:
    """``POST /v1/responses/{name}``: OpenAI's actions on responses are POSTs to a name under
    ``/v1/responses/`` (``input_tokens``, ``compact``); one this server does not serve is an
    unknown URL (404: the SDK's ``NotFoundError``), not a wrong method on a response's path."""
    raise _invalid_url(request)


def _invalid_url(request: Request) -> APIError:
    return APIError(404, f"Invalid URL ({request.method} {request.url.path})")


def _allowed(request: Request) -> str:
    """The methods the path takes, over every route that serves it (Starlette's 405 names only
    the first route that matched the path)."""
    methods: list[str] = []
    for route in routes:
        methods_of = getattr(route, "methods", None)
        if (
            route.name != "unknown_action"
            and route.path_regex.match(request.url.path)
            and methods_of
        ):
            methods.extend(m for m in sorted(methods_of) if m not in methods)
    return ", ".join(methods)


def route_error(request: Request, exc: HTTPException) -> APIError:
    """What Starlette's router raises, in OpenAI's shape: an unknown path is 404 ``Invalid URL``
    (as OpenAI words it), a known path asked with a method it does not take is 405 with
    ``Allow``; anything else keeps its status."""
    if exc.status_code == 404:
        return _invalid_url(request)
    if exc.status_code == 405:
        allowed = _allowed(request)
        return APIError(
            405,
            f"Method {request.method} is not allowed for {request.url.path}; use {allowed}.",
            headers={"Allow": allowed} if allowed else None,
        )
    return APIError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}) or None)


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


async def metrics(request: Request) -> Response:
    """Prometheus exposition (``app.metrics``): an admin's when keys are on (403 for a member);
    404 when metrics are off."""
    metrics: Metrics = request.app.state.metrics
    if not metrics.enabled:
        raise _invalid_url(request)
    if caller_of(request).role != "admin":
        metrics.auth_failures.labels("not_admin").inc()
        raise APIError(
            403,
            "The metrics need an admin key (responses-ledger keys create --role admin).",
            type="permission_error",
            code="admin_only",
        )
    return Response(metrics.scrape(), media_type=CONTENT_TYPE)


async def live(request: Request) -> Response:
    """Liveness (Kubernetes ``livenessProbe``): 200 while the process answers HTTP at all."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    """Readiness (a load balancer's health check, Kubernetes ``readinessProbe``): 200 when this
    replica takes new responses; 503 while it starts, drains (SIGTERM, ``app.drain``), or
    cannot use its engine or database."""
    state = request.app.state
    if getattr(state, "ready", False) and _service(request).drain.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return await health(request)


routes: list[Route | WebSocketRoute] = [
    Route("/v1/responses", guard(create_response), methods=["POST"]),
    Route("/v1/responses/input_tokens", guard(count_input_tokens), methods=["POST"]),
    Route("/v1/responses/compact", guard(compact_response), methods=["POST"]),
    # scoped: another project's response is 404, exactly like a missing one (app.ownership);
    # guard: whatever a route raises is an OpenAI-shaped answer (app.errors)
    Route("/v1/responses/{response_id}", guard(scoped(get_response)), methods=["GET"]),
    Route("/v1/responses/{response_id}", guard(scoped(delete_response)), methods=["DELETE"]),
    Route(
        "/v1/responses/{response_id}",
        guard(unknown_action),
        methods=["POST"],
        name="unknown_action",
    ),
    Route("/v1/responses/{response_id}/cancel", guard(scoped(cancel_response)), methods=["POST"]),
    Route(
        "/v1/responses/{response_id}/input_items", guard(scoped(list_input_items)), methods=["GET"]
    ),
    Route(
        "/v1/responses/{response_id}/events",
        guard(scoped(list_events, audit=True)),
        methods=["GET"],
    ),
    *conversation_routes,  # /v1/conversations (app.conversation_routes)
    *websocket_routes,  # WebSocket mode on /v1/responses (app.websocket)
    Route("/v1/models", guard(list_models), methods=["GET"]),
    Route("/v1/models/{model:path}", guard(retrieve_model), methods=["GET"]),
    Route("/health", guard(health), methods=["GET"]),
    Route("/health/live", guard(live), methods=["GET"]),
    Route("/health/ready", guard(ready), methods=["GET"]),
    Route("/metrics", guard(metrics), methods=["GET"]),
    *ui_routes,  # /ui, the audit page (app.ui)
    # the OpenAPI document of these routes (app.openapi: add an Operation there for a new route)
    Route("/openapi.json", guard(openapi.serve), methods=["GET"]),
]

"""WebSocket mode on ``/v1/responses``: the response log projected onto a socket.

A client (the openai SDK's ``client.responses.connect()``, Codex with the built-in OpenAI
provider) opens one WebSocket at ``/v1/responses`` and sends JSON text messages:

- ``{"type": "response.create", ...}``: the body of ``POST /v1/responses`` (``stream`` is
  implicit; ``background`` is refused), plus the WebSocket envelope: ``stream_id`` (the lane:
  requests of one lane run one after another, in order; lanes run side by side; every event of
  the response echoes it) and ``generate`` (``false``: validate the request and keep its input as
  state for a later ``previous_response_id``, generating nothing). Each runs a response exactly as
  a streaming POST does: the same validation, ids, log and storage; its events go back as text
  messages, each the JSON ``data`` of the SSE frame the POST would have sent, so a ``store=true``
  response can be resumed over HTTP afterwards
  (``GET /v1/responses/{id}?stream=true&starting_after=N``) at the same sequence numbers.
- ``{"type": "response.steer", "previous_response_id": ..., "input": ...}``: queue user input for
  a continuation of a response running on this connection (the SDK's steering). It is
  acknowledged with ``response.steer.accepted``; when the response completes, an automatic
  successor (the same settings, ``previous_response_id`` = the steered one, the queued input in
  submission order) runs on the same lane, and its ``response.created`` is the commit point. A
  response that stops for client tool output keeps the input queued and says so with
  ``response.steer.pending`` (its ``required_input`` stubs); the next explicit ``response.create``
  continuing it gets the queued input prepended. Input that cannot be committed comes back in
  ``response.steer.failed``. The server does not cut a response short to apply steering (it never
  ends one ``incomplete``/``steered``): the successor starts when the response completes.

Every failure is an ``error`` message in the WebSocket shape (``{"type": "error", "status",
"error": {"type", "code", "message", "param"}}``, which the SDK and Codex read as the HTTP error
it stands for); the socket stays open. A response's own stream error (the database went away) is
sent in the same shape with its ``sequence_number``. Authentication, the key's rate and its
stream slots apply exactly as over HTTP: :class:`app.auth.KeyAuth` answers a refused upgrade
with the HTTP error itself (401, 429, 503); each ``response.create`` counts as one request and
holds one stream slot while it streams.

``store=false`` responses have no log; this connection keeps each one's history (its input and
output items) so that a later ``response.create`` on the same connection may continue it with
``previous_response_id``, as OpenAI's WebSocket mode allows (Codex does so); another connection
or an HTTP request cannot.

Steering events are not in any response's log: their ``sequence_number`` is that of the steered
response's last event sent on this connection, and they take no slot of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from app.contract import check_request
from app.errors import APIError, to_api_error
from app.ids import new_id
from app.keys import Caller
from app.limits import CALLER, KeyLimits
from app.logs import request_id_headers
from app.prompting import normalize_input
from app.service import ResponseService
from app.wire import CreateResponse

__all__ = ["routes", "sse_data"]

log = logging.getLogger(__name__)

#: Fields of a ``response.create`` message that are the socket's, not the request's.
_ENVELOPE = ("type", "stream_id", "generate")
#: Steering input a response may hold queued at once.
_MAX_PENDING_STEERS = 16
#: Item types whose output the client owns: a response that ends with one waits for it.
_CLIENT_CALLS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
}
_STEER_PART_TYPES = ("input_text", "input_image", "input_file")


def sse_data(chunk: bytes) -> list[str]:
    """The JSON ``data`` of every SSE frame in ``chunk`` (frames are ``event: T\\ndata: JSON\\n\\n``
    with one-line JSON, see ``domain.projections.sse_frame``): what the WebSocket sends."""
    out: list[str] = []
    for frame in chunk.split(b"\n\n"):
        at = frame.find(b"data: ")
        if at >= 0:
            out.append(frame[at + 6 :].decode())
    return out


@dataclass
class _Steer:
    id: str
    input: Any
    previous_response_id: str


@dataclass
class _Active:
    """A response created on this connection: its lane, settings and queued steering."""

    id: str
    lane: str | None
    body: dict[str, Any]
    store: bool
    last_seq: int = -1
    open: bool = True  # accepting steering
    steers: list[_Steer] = field(default_factory=list)
    pending_on: list[dict[str, Any]] | None = None  # the required_input it waits for
    final: dict[str, Any] | None = None  # the response its terminal event carried


class _Failure(Exception):
    """A ``response.steer`` that cannot be accepted: the code of its ``response.steer.failed``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ResponsesSocket:
    """One WebSocket connection's lanes, responses and steering."""

    def __init__(self, websocket: WebSocket) -> None:
        self.ws = websocket
        self.service: ResponseService = websocket.app.state.service
        self.limits: KeyLimits = websocket.app.state.limits
        self.caller: Caller = websocket.scope[CALLER]
        self._send_lock = asyncio.Lock()
        self._lanes: dict[str | None, asyncio.Queue[dict[str, Any] | None]] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._active: dict[str, _Active] = {}
        #: store=false responses of this connection: their history, for previous_response_id
        #: (the stored response it continues, if any; its input and output items)
        self._local: dict[str, tuple[str | None, list[dict[str, Any]]]] = {}

    async def serve(self) -> None:
        await self.ws.accept(headers=request_id_headers(self.ws.scope))
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    await self._error(
                        APIError(
                            400,
                            "Messages must be JSON text frames, not binary.",
                            code="invalid_message",
                        )
                    )
                    continue
                await self._dispatch(text)
        except WebSocketDisconnect:
            pass
        finally:
            for worker in self._workers:
                worker.cancel()
            for worker in list(self._workers):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await worker

    async def _dispatch(self, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            await self._error(APIError(400, "The message is not valid JSON.", code="invalid_json"))
            return
        if not isinstance(message, dict):
            await self._error(
                APIError(
                    400, "A message must be a JSON object with a 'type'.", code="invalid_message"
                )
            )
            return
        kind = message.get("type")
        if kind == "response.create":
            lane = message.get("stream_id")
            if lane is not None and not isinstance(lane, str):
                await self._error(
                    APIError(
                        400, "'stream_id' must be a string.", param="stream_id", code="invalid_type"
                    )
                )
                return
            self._lane(lane).put_nowait(message)
        elif kind == "response.steer":
            await self._steer(message)
        else:
            await self._error(
                APIError(
                    400,
                    f"Unknown message type {kind!r}: send 'response.create' or 'response.steer'.",
                    param="type",
                    code="unknown_event_type",
                )
            )

    def _lane(self, lane: str | None) -> asyncio.Queue[dict[str, Any] | None]:
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = asyncio.Queue()
            worker = asyncio.create_task(self._work(lane, queue))
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        return queue

    async def _work(self, lane: str | None, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        while True:
            message = await queue.get()
            if message is None:
                return
            try:
                await self._create(message, lane)
            except asyncio.CancelledError:
                raise
            except WebSocketDisconnect:
                return
            except Exception as exc:
                await self._error(to_api_error(exc), lane)

    # -- response.create ---------------------------------------------------------------------

    async def _create(
        self, message: dict[str, Any], lane: str | None, steers: list[_Steer] | None = None
    ) -> None:
        body = {k: v for k, v in message.items() if k not in _ENVELOPE}
        generate = message.get("generate", True)
        if generate is None:
            generate = True
        if not isinstance(generate, bool):
            raise APIError(
                400, "'generate' must be a boolean.", param="generate", code="invalid_type"
            )
        if body.get("stream") is False:
            raise APIError(
                400,
                "'stream' is implicit over WebSocket: leave it out.",
                param="stream",
                code="invalid_value",
            )
        if body.get("background"):
            raise APIError(
                400,
                "'background' is not supported over WebSocket.",
                param="background",
                code="invalid_value",
            )
        body.pop("background", None)
        body["stream"] = True
        parent = body.get("previous_response_id")
        queued: list[_Steer] = []
        if steers is None and isinstance(parent, str):
            waiting = self._active.get(parent)
            if waiting is not None and waiting.pending_on is not None and waiting.lane == lane:
                queued = list(waiting.steers)  # prepended in submission order
        elif steers is not None:
            queued = steers
        if queued:
            own = body.get("input", [])
            body["input"] = [
                *(i for s in queued for i in _steer_items(s.input)),
                *normalize_input(own or []),
            ]
        body = self._with_local_history(body)
        check_request(body)
        create = CreateResponse.model_validate(body)
        refused = self.limits.admit(self.caller)
        if refused is not None:
            raise refused
        if not generate:
            await self._prepare(create, body, lane)
            return
        release = self.limits.open_stream(self.caller)
        try:
            await self._run(create, body, lane, queued)
        finally:
            release()

    def _with_local_history(self, body: dict[str, Any]) -> dict[str, Any]:
        """A ``previous_response_id`` naming a ``store=false`` response of this connection is
        replaced by that response's history (it has no log to be read from)."""
        parent = body.get("previous_response_id")
        if not isinstance(parent, str) or parent not in self._local:
            return body
        own = body.get("input") or []
        stored_parent, history = self._local[parent]
        rest = {k: v for k, v in body.items() if k != "previous_response_id"}
        if stored_parent is not None:
            rest["previous_response_id"] = stored_parent
        return {**rest, "input": [*history, *normalize_input(own)]}

    async def _prepare(
        self, create: CreateResponse, body: dict[str, Any], lane: str | None
    ) -> None:
        """``generate: false``: the request is checked (rendered against the model's context, as
        ``create`` would) and its input kept as this connection's state under a new response id,
        which a later ``response.create`` names as ``previous_response_id``. Nothing is
        generated or stored: the response is ``store=false``-like whatever ``store`` says, so
        only this connection can continue it."""
        await self.service.prompts.prompt(create, self.caller.project)
        response_id = new_id("resp")
        history = normalize_input(body.get("input") or [])
        self._local[response_id] = (body.get("previous_response_id"), history)
        created_at = _now()
        skeleton = self.service.skeleton(
            create, response_id, created_at, self.service.resolve_model(create.model)
        )
        skeleton["store"] = False
        skeleton["previous_response_id"] = body.get("previous_response_id")
        done_response = {**skeleton, "status": "completed", "completed_at": created_at}
        created = {"type": "response.created", "sequence_number": 0, "response": skeleton}
        done = {
            "type": "response.completed",
            "sequence_number": 1,
            "response": done_response,
        }
        for event in (created, done):
            await self._send(json.dumps(_with_lane(event, lane)))

    async def _run(
        self, create: CreateResponse, body: dict[str, Any], lane: str | None, steers: list[_Steer]
    ) -> None:
        service = self.service
        run = await service.create(
            create, body, project=self.caller.project, api_key_id=self.caller.key_id
        )
        active = _Active(run.id, lane, body, run.store)
        self._active[run.id] = active
        for steer in steers:  # committed: the successor that carries them exists now
            steer_of = self._active.get(steer.previous_response_id)
            if steer_of is not None and steer in steer_of.steers:
                steer_of.steers.remove(steer)
                if not steer_of.steers:
                    steer_of.pending_on = None
        finished = False
        try:
            await run.created.wait()
            if not run.published:
                raise (
                    run.error
                    if isinstance(run.error, Exception)
                    else APIError(500, "The response could not be stored.", type="server_error")
                )
            async for chunk in service.stream(run.id, -1, run=run, queue=run.first_queue):
                for data in sse_data(chunk):
                    await self._send(_ws_event(data, lane, active))
            finished = True
        finally:
            active.open = False
            if not finished and not run.store:
                await service.abort_unread(run)
        self._remember(active, body)
        await self._after(active)

    def _remember(self, active: _Active, body: dict[str, Any]) -> None:
        if active.store or active.final is None:
            return
        history = normalize_input(body.get("input") or [])
        output = [_as_input(item) for item in active.final.get("output", [])]
        self._local[active.id] = (body.get("previous_response_id"), [*history, *output])

    async def _after(self, active: _Active) -> None:
        """What steering queued on a response that has just ended becomes."""
        if not active.steers:
            return
        final = active.final or {}
        status = final.get("status")
        if status != "completed":
            for steer in list(active.steers):
                await self._steer_failed(
                    steer,
                    active,
                    "response_not_active",
                    f"The response ended {status or 'without an answer'}; the input was not applied.",
                )
            active.steers.clear()
            return
        required = [
            _required(item) for item in final.get("output", []) if item.get("type") in _CLIENT_CALLS
        ]
        if required:
            active.pending_on = required
            for steer in active.steers:
                await self._send_event(
                    {
                        "type": "response.steer.pending",
                        "sequence_number": active.last_seq,
                        "reason": "waiting_for_required_input",
                        "required_input": required,
                        "steer": {"id": steer.id, "previous_response_id": active.id},
                    },
                    active.lane,
                )
            return
        steers = list(active.steers)
        successor = {
            **{
                k: v
                for k, v in active.body.items()
                if k not in ("input", "previous_response_id", "stream")
            },
            "type": "response.create",
            "previous_response_id": active.id,
            "input": [],
        }
        try:
            await self._create(successor, active.lane, steers)
        except (WebSocketDisconnect, asyncio.CancelledError):
            raise
        except Exception as exc:
            err = to_api_error(exc)
            for steer in steers:
                await self._steer_failed(steer, active, "successor_creation_failed", err.message)
        finally:
            active.steers = [s for s in active.steers if s not in steers]

    # -- response.steer ----------------------------------------------------------------------

    async def _steer(self, message: dict[str, Any]) -> None:
        target = message.get("previous_response_id")
        steer_input = message.get("input")
        try:
            extra = sorted(set(message) - {"type", "previous_response_id", "input"})
            if extra:
                raise _Failure(
                    "invalid_input",
                    f"response.steer takes only type, previous_response_id and input, not {extra[0]!r}.",
                )
            if not isinstance(target, str) or not target:
                raise _Failure(
                    "invalid_input",
                    "'previous_response_id' must name a response on this connection.",
                )
            _check_steer_input(steer_input)
            active = self._active.get(target)
            if active is None:
                raise _Failure(
                    "response_not_found", f"No response '{target}' is running on this connection."
                )
            if not active.store:
                raise _Failure(
                    "steering_not_supported",
                    "Steering needs a stored response (store=true): its successor continues it through its log.",
                )
            if active.body.get("conversation") or active.body.get("context_management"):
                raise _Failure(
                    "steering_not_supported",
                    "Responses bound to a conversation or using automatic compaction do not support steering.",
                )
            if not active.open and active.pending_on is None:
                raise _Failure(
                    "response_already_completed", f"The response '{target}' has completed."
                )
            if len(active.steers) >= _MAX_PENDING_STEERS:
                raise _Failure(
                    "too_many_pending_steers",
                    f"At most {_MAX_PENDING_STEERS} steering inputs may be queued per response.",
                )
        except _Failure as failure:
            seq = (
                self._active[target].last_seq
                if isinstance(target, str) and target in self._active
                else 0
            )
            await self._send_event(
                {
                    "type": "response.steer.failed",
                    "sequence_number": max(seq, 0),
                    "error": {
                        "type": "invalid_request_error",
                        "code": failure.code,
                        "message": failure.message,
                    },
                    "steer": {
                        "input": steer_input,
                        "previous_response_id": target if isinstance(target, str) else "",
                    },
                },
                self._active[target].lane
                if isinstance(target, str) and target in self._active
                else None,
            )
            return
        steer = _Steer(new_id("steer"), steer_input, target)
        active.steers.append(steer)
        await self._send_event(
            {
                "type": "response.steer.accepted",
                "sequence_number": max(active.last_seq, 0),
                "steer": {"id": steer.id, "previous_response_id": target},
            },
            active.lane,
        )
        if active.pending_on is not None:
            await self._send_event(
                {
                    "type": "response.steer.pending",
                    "sequence_number": active.last_seq,
                    "reason": "waiting_for_required_input",
                    "required_input": active.pending_on,
                    "steer": {"id": steer.id, "previous_response_id": target},
                },
                active.lane,
            )

    async def _steer_failed(self, steer: _Steer, active: _Active, code: str, message: str) -> None:
        await self._send_event(
            {
                "type": "response.steer.failed",
                "sequence_number": max(active.last_seq, 0),
                "error": {"type": "invalid_request_error", "code": code, "message": message},
                "steer": {
                    "id": steer.id,
                    "input": steer.input,
                    "previous_response_id": steer.previous_response_id,
                },
            },
            active.lane,
        )

    # -- sending -----------------------------------------------------------------------------

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            if self.ws.application_state != WebSocketState.CONNECTED:
                raise WebSocketDisconnect(1006)
            await self.ws.send_text(text)

    async def _send_event(self, event: dict[str, Any], lane: str | None) -> None:
        await self._send(json.dumps(_with_lane(event, lane)))

    async def _error(self, err: APIError, lane: str | None = None) -> None:
        event: dict[str, Any] = {
            "type": "error",
            "status": err.status,
            "error": {
                "type": err.type,
                "code": err.code,
                "message": err.message,
                "param": err.param,
            },
        }
        if err.headers:
            event["error"]["headers"] = dict(err.headers)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self._send_event(event, lane)


def _now() -> int:
    return int(time.time())


def _with_lane(event: dict[str, Any], lane: str | None) -> dict[str, Any]:
    return event if lane is None else {**event, "stream_id": lane}


_TERMINAL_PREFIXES = tuple(
    f'{{"type":"{t}"'.encode().decode()
    for t in ("response.completed", "response.incomplete", "response.failed")
)
#: Error codes of a stream's own ``error`` event and the HTTP status each stands for.
_STREAM_ERROR_STATUS = {"store_unavailable": 503, "server_shutting_down": 503, "not_found": 404}


def _ws_event(data: str, lane: str | None, active: _Active) -> str:
    """One event of the log as its WebSocket message: the SSE frame's JSON, with the lane; a
    stream's closing ``error`` event (not in the log) in the WebSocket error shape."""
    if data.startswith('{"type":"error"'):
        event = json.loads(data)
        code = event.get("code")
        out: dict[str, Any] = {
            "type": "error",
            "sequence_number": event.get("sequence_number"),
            "status": _STREAM_ERROR_STATUS.get(code or "", 500),
            "error": {
                "type": "server_error",
                "code": code,
                "message": event.get("message"),
                "param": event.get("param"),
            },
        }
        return json.dumps(_with_lane(out, lane))
    if data.startswith(_TERMINAL_PREFIXES):
        active.final = json.loads(data)["response"]
    seq_at = data.find('"sequence_number":')
    if seq_at >= 0:
        end = data.find(",", seq_at)
        with contextlib.suppress(ValueError):
            active.last_seq = int(data[seq_at + 18 : end])
    if lane is None:
        return data
    return data[:-1] + ',"stream_id":' + json.dumps(lane) + "}"


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the next request's input item (what a client sends back)."""
    return {
        k: v for k, v in item.items() if not (k == "status" and item.get("type") == "reasoning")
    }


def _required(item: dict[str, Any]) -> dict[str, Any]:
    kind = _CLIENT_CALLS[item["type"]]
    stub: dict[str, Any] = {"type": kind, "call_id": item["call_id"]}
    if kind == "function_call_output":
        stub["name"] = item.get("name", "")
    return stub


def _check_steer_input(value: Any) -> None:
    """Steering takes a string or a non-empty list of user messages (``type``, ``role``,
    ``content``: a string or ``input_text``/``input_image``/``input_file`` parts)."""
    if isinstance(value, str):
        if not value:
            raise _Failure("invalid_input", "'input' must not be empty.")
        return
    if not isinstance(value, list) or not value:
        raise _Failure(
            "invalid_input", "'input' must be a string or a non-empty list of user messages."
        )
    for n, item in enumerate(value):
        if not isinstance(item, dict):
            raise _Failure("invalid_input", f"input[{n}] must be a message object.")
        extra = set(item) - {"type", "role", "content"}
        if item.get("type", "message") != "message" or item.get("role") != "user" or extra:
            raise _Failure(
                "invalid_input",
                f"input[{n}]: steering accepts only user messages with type, role and content.",
            )
        content = item.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
            isinstance(p, dict) and p.get("type") in _STEER_PART_TYPES for p in content
        ):
            raise _Failure(
                "invalid_input",
                f"input[{n}].content must be a string or input_text, input_image and input_file parts.",
            )


def _steer_items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [{"type": "message", **item} for item in value]


async def responses_socket(websocket: WebSocket) -> None:
    await ResponsesSocket(websocket).serve()


routes = [WebSocketRoute("/v1/responses", responses_socket)]

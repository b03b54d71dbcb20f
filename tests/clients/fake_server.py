"""A recording fake of ``POST /v1/responses``, for finding out what real clients send and need.

Real clients (the Codex CLI, the Agents SDK) are pointed at :class:`RecordingServer`; it records
every request (path, headers, JSON body) and answers each ``POST /v1/responses`` with the next
scripted turn: a function of the request body that returns a :class:`ResponseScript`. The script
emits events the way OpenAI's API does (created, in_progress, added / part / delta / done per
item, one terminal event), so the canned streams must themselves pass ``tests.support.openapi``,
``tests.support.stream_checker.check_stream`` and ``validate_with_sdk``; the tests check that,
which keeps the fake honest and the checkers exercised against a known-good stream.

``stream: true`` requests get ``text/event-stream`` (``event:`` + ``data:`` lines, like OpenAI);
other requests get the final Response object as JSON. ``http.server`` in a thread keeps it free of
the event loop, so sync (a subprocess) and async (an ``AsyncOpenAI``) clients can both use it.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RecordedRequest", "RecordingServer", "ResponseScript", "Turn", "sse_body"]

CREATED_AT = 1_767_225_600  # fixed, so recorded runs are reproducible


class ResponseScript:
    """The events of one streamed response, built item by item as OpenAI emits them."""

    def __init__(
        self, request: Mapping[str, Any], *, response_id: str, chunk_size: int = 5
    ) -> None:
        self.request = request
        self.response_id = response_id
        self.chunk_size = chunk_size
        self._items: list[dict[str, Any]] = []
        self._body: list[dict[str, Any]] = []  # events between in_progress and the terminal

    # -- items ----------------------------------------------------------------------------------

    def reasoning(self, text: str, *, encrypted_content: str | None = None) -> dict[str, Any]:
        """A gpt-oss style reasoning item: raw chain of thought as one ``reasoning_text`` part."""
        item_id = self._next_id("rs")
        added: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": [], "content": []}
        done: dict[str, Any] = {
            "id": item_id,
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed",
        }
        if encrypted_content is not None:
            added["encrypted_content"] = None
            done["encrypted_content"] = encrypted_content
        index = self._open(added)
        self._part(
            index,
            item_id,
            {"type": "reasoning_text", "text": ""},
            "text",
            text,
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            logprobs=False,
        )
        return self._close(index, done)

    def message(self, text: str, *, phase: str | None = None) -> dict[str, Any]:
        item_id = self._next_id("msg")
        base: dict[str, Any] = {"id": item_id, "type": "message", "role": "assistant"}
        if phase is not None:
            base["phase"] = phase
        index = self._open({**base, "status": "in_progress", "content": []})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._part(
            index,
            item_id,
            part,
            "text",
            text,
            "response.output_text.delta",
            "response.output_text.done",
            logprobs=True,
        )
        finished = {**part, "text": text}
        return self._close(index, {**base, "status": "completed", "content": [finished]})

    def function_call(
        self, name: str, arguments: str, *, call_id: str, namespace: str | None = None
    ) -> dict[str, Any]:
        item_id = self._next_id("fc")
        base: dict[str, Any] = {
            "id": item_id,
            "type": "function_call",
            "call_id": call_id,
            "name": name,
        }
        if namespace is not None:
            base["namespace"] = namespace
        index = self._open({**base, "arguments": "", "status": "in_progress"})
        for piece in self._chunks(arguments):
            self._emit(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item_id,
                    "output_index": index,
                    "delta": piece,
                }
            )
        self._emit(
            {
                "type": "response.function_call_arguments.done",
                "item_id": item_id,
                "output_index": index,
                "name": name,
                "arguments": arguments,
            }
        )
        return self._close(index, {**base, "arguments": arguments, "status": "completed"})

    # -- the stream -----------------------------------------------------------------------------

    def response(
        self,
        status: str,
        *,
        output: Sequence[Mapping[str, Any]] = (),
        usage: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Response object as OpenAI returns it, echoing the request's settings."""
        request = self.request
        reasoning = request.get("reasoning") or {}
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": CREATED_AT,
            "status": status,
            "background": bool(request.get("background", False)),
            "completed_at": CREATED_AT + 1 if status == "completed" else None,
            "error": None,
            "incomplete_details": None,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "max_tool_calls": request.get("max_tool_calls"),
            "model": request["model"],
            "output": list(output),
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "previous_response_id": request.get("previous_response_id"),
            "prompt_cache_key": request.get("prompt_cache_key"),
            "reasoning": {
                "effort": reasoning.get("effort", "medium"),
                "summary": reasoning.get("summary"),
            },
            "safety_identifier": request.get("safety_identifier"),
            "service_tier": "default",
            "store": request.get("store", True),
            "temperature": request.get("temperature", 1.0),
            "text": request.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": request.get("tool_choice", "auto"),
            "tools": request.get("tools", []),
            "top_logprobs": request.get("top_logprobs", 0),
            "top_p": request.get("top_p", 1.0),
            "truncation": request.get("truncation", "disabled"),
            "usage": usage,
            "user": request.get("user"),
            "metadata": request.get("metadata") or {},
        }

    def usage(self) -> dict[str, Any]:
        output_tokens = sum(len(json.dumps(item)) // 4 for item in self._items)
        return {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 100 + output_tokens,
        }

    def final(self) -> dict[str, Any]:
        """The finished Response object (what a non-streaming request gets)."""
        return self.response("completed", output=copy.deepcopy(self._items), usage=self.usage())

    def events(self) -> list[dict[str, Any]]:
        """Every event of the stream, ``sequence_number`` 0, 1, ..."""
        events = [
            {"type": "response.created", "response": self.response("in_progress")},
            {"type": "response.in_progress", "response": self.response("in_progress")},
            *self._body,
            {"type": "response.completed", "response": self.final()},
        ]
        # deep copies: the events share item dicts, a wire stream never does
        return [copy.deepcopy({**event, "sequence_number": n}) for n, event in enumerate(events)]

    # -- internals ------------------------------------------------------------------------------

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}_{self.response_id.removeprefix('resp_')}_{len(self._items)}"

    def _chunks(self, text: str) -> Iterator[str]:
        for start in range(0, len(text), self.chunk_size):
            yield text[start : start + self.chunk_size]

    def _emit(self, event: dict[str, Any]) -> None:
        self._body.append(event)

    def _open(self, item: dict[str, Any]) -> int:
        index = len(self._items)
        self._items.append(item)  # replaced by the done item in _close
        self._emit({"type": "response.output_item.added", "output_index": index, "item": item})
        return index

    def _close(self, index: int, item: dict[str, Any]) -> dict[str, Any]:
        self._items[index] = item
        self._emit({"type": "response.output_item.done", "output_index": index, "item": item})
        return item

    def _part(
        self,
        index: int,
        item_id: str,
        part: dict[str, Any],
        text_field: str,
        text: str,
        delta_type: str,
        done_type: str,
        *,
        logprobs: bool,
    ) -> None:
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        extra: dict[str, Any] = {"logprobs": []} if logprobs else {}
        self._emit({"type": "response.content_part.added", **where, "part": part})
        for piece in self._chunks(text):
            self._emit({"type": delta_type, **where, "delta": piece, **extra})
        self._emit({"type": done_type, **where, text_field: text, **extra})
        self._emit(
            {"type": "response.content_part.done", **where, "part": {**part, text_field: text}}
        )


def sse_body(events: Sequence[Mapping[str, Any]]) -> bytes:
    """Server-sent events as OpenAI frames them: an ``event:`` line and a ``data:`` line."""
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
        for event in events
    )


Turn = Callable[[Mapping[str, Any], str], ResponseScript]
"""A scripted turn: (request body, response id) -> the response to stream."""


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any  # decoded JSON, or the raw text if it was not JSON


class RecordingServer:
    """``with RecordingServer([turn1, turn2]) as server:`` serves ``server.base_url`` (…/v1)."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        self.requests: list[RecordedRequest] = []
        self.scripts: list[ResponseScript] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="recording-responses-server",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}/v1"

    @property
    def response_bodies(self) -> list[Mapping[str, Any]]:
        """The JSON bodies of the ``POST /v1/responses`` requests, in arrival order."""
        return [r.body for r in self.requests if r.method == "POST" and r.path == "/v1/responses"]

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _answer(self, request: RecordedRequest) -> tuple[int, str, bytes]:
        with self._lock:
            self.requests.append(request)
            if request.method != "POST" or request.path != "/v1/responses":
                return _error(
                    404,
                    f"the fake serves POST /v1/responses only, not {request.method} {request.path}",
                )
            turn_number = len(self.scripts)
            if turn_number >= len(self.turns):
                return _error(
                    500,
                    f"unscripted request #{turn_number + 1}: only {len(self.turns)} turns scripted",
                )
            if not isinstance(request.body, Mapping):
                return _error(400, "body is not a JSON object")
            script = self.turns[turn_number](request.body, f"resp_fake{turn_number + 1}")
            self.scripts.append(script)
        if request.body.get("stream"):
            return 200, "text/event-stream", sse_body(script.events())
        return 200, "application/json", json.dumps(script.final()).encode()


def _error(status: int, message: str) -> tuple[int, str, bytes]:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    return status, "application/json", json.dumps(body).encode()


def _handler_for(server: RecordingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve(b"")

        def do_POST(self) -> None:
            self._serve(self.rfile.read(int(self.headers.get("content-length") or 0)))

        def _serve(self, raw: bytes) -> None:
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            recorded = RecordedRequest(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
            status, content_type, payload = server._answer(recorded)
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler

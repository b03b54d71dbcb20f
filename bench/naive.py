"""The naive peer: the cheapest honest Responses streaming server, as a yardstick for the ledger.

``POST /v1/responses`` streams a realistic OpenAI event sequence for one assistant message of
``n`` tokens (the body's bench-only ``n``, else its ``max_output_tokens``)::

    response.created, response.in_progress, response.output_item.added,
    response.content_part.added, n x response.output_text.delta, response.output_text.done,
    response.content_part.done, response.output_item.done, response.completed

that is ``n + 8`` events, ``sequence_number`` 0..n+7. Nothing is parsed beyond the request body,
nothing is stored, no model runs: each delta frame is one ``bytes % (seq, word)`` of a template
built once per response (about 215 bytes with its ``event:`` line; the ``data:`` JSON alone is
about 170), handed to sse-starlette as ``bytes`` so it is sent as-is, one ASGI send (one socket
write) per event. With ``--coalesce K`` it hands over K delta frames per send instead, which shows
what the per-write overhead costs.

This is the same stack the ledger serves with (Starlette, sse-starlette, uvicorn; by default with
uvicorn's ``auto`` choice of event loop and HTTP parser, i.e. uvloop and httptools when they are
installed, as they are with vLLM; ``--loop asyncio --http h11`` for the pure-Python stack), so the difference between the two is what the ledger does per
event: decoding, the state machine, the durable append and the projection to a frame.

When ``BENCH_TOKEN_TIMES_DIR`` is set it writes the token-times side file
(:mod:`bench.token_times`): a delta's "yield" time is when its frame is handed to the transport,
the naive peer's equivalent of an engine yielding the token.

``--raw`` serves the same bytes from a bare ``asyncio.Protocol`` (no Starlette, sse-starlette,
uvicorn or h11), still one socket write per event: what one write per event costs with no framework
at all, and a fast enough sender to check that the load generator is not the bottleneck.

Run: ``python -m bench.naive --port 8123 [--coalesce 16] [--raw]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.engines.echo import StepClock
from bench import token_times

__all__ = ["NaiveSettings", "create_app", "main"]

MAX_TOKENS = 1_000_000

# Pre-escaped JSON string contents; every word is one o200k token, so the text is realistic.
_WORDS: tuple[bytes, ...] = tuple(
    w.encode()
    for w in (
        " The",
        " quick",
        " brown",
        " fox",
        " jumps",
        " over",
        " the",
        " lazy",
        " dog",
        ".",
        " It",
        " was",
        " a",
        " bright",
        " cold",
        " day",
        " in",
        " April",
        ",",
        " and",
        " clocks",
        " were",
        " striking",
        " thirteen",
    )
)


#: Paced, the steps a stream waits before its first delta and after its last: a gpt-oss engine
#: generates Harmony tokens around a final-channel answer that no delta carries
#: (``<|channel|>final<|message|>`` before it, ``<|return|>`` after it), one step each, as the
#: ledger's scripted engine does with the benchmark's script (``bench.targets.ledger_script``).
#: Without them the peer's streams took 4 steps fewer for the same text (2% at 200 tokens).
FRAMING_STEPS = (3, 1)


@dataclass(frozen=True, slots=True)
class NaiveSettings:
    coalesce: int = 1
    model: str = "gpt-oss-20b"
    token_times_dir: Path | None = None
    #: Paces the deltas as the ledger's scripted engine paces its tokens: all streams advance
    #: together, one delta each per step (None: as fast as possible).
    clock: StepClock | None = None

    @classmethod
    def from_env(cls, coalesce: int = 1, token_delay_ms: float = 0.0) -> NaiveSettings:
        return cls(
            coalesce=coalesce,
            token_times_dir=token_times.directory_from_env(),
            clock=StepClock(token_delay_ms / 1000) if token_delay_ms else None,
        )


def _frame(event_type: str, payload: dict) -> bytes:
    data = json.dumps({"type": event_type, **payload}, separators=(",", ":"))
    return f"event: {event_type}\ndata: {data}\n\n".encode()


def _response_object(
    response_id: str,
    created_at: int,
    model: str,
    max_tokens: int,
    status: str,
    output: list,
    usage: dict | None,
) -> dict:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": max_tokens,
        "max_tool_calls": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "auto",
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


async def _events(
    n: int, model: str, coalesce: int, times_dir: Path | None, clock: StepClock | None = None
) -> AsyncIterator[bytes]:
    response_id = "resp_" + uuid.uuid4().hex
    item_id = "msg_" + uuid.uuid4().hex
    created_at = int(time.time())
    in_progress = _response_object(response_id, created_at, model, n, "in_progress", [], None)
    yield _frame("response.created", {"sequence_number": 0, "response": in_progress})
    yield _frame("response.in_progress", {"sequence_number": 1, "response": in_progress})
    yield _frame(
        "response.output_item.added",
        {
            "sequence_number": 2,
            "output_index": 0,
            "item": {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "content": [],
                "role": "assistant",
            },
        },
    )
    yield _frame(
        "response.content_part.added",
        {
            "sequence_number": 3,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""},
        },
    )

    template = (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"sequence_number":%d,"item_id":"' + item_id.encode() + b'","output_index":0,'
        b'"content_index":0,"delta":"%s","logprobs":[]}\n\n'
    )
    words = _WORDS
    nwords = len(words)
    times = token_times.TokenTimes(times_dir)
    mark = times.mark if times.enabled else None
    seq = 4
    if clock is not None:  # the engine's steps for the Harmony tokens before the text
        for _ in range(FRAMING_STEPS[0]):
            await clock.step()
    if coalesce <= 1:
        for i in range(n):
            if clock is not None:
                await clock.step()
            frame = template % (seq, words[i % nwords])
            if mark is not None:
                mark()
            yield frame
            seq += 1
    else:
        batch: list[bytes] = []
        for i in range(n):
            if clock is not None:
                await clock.step()
            batch.append(template % (seq, words[i % nwords]))
            if mark is not None:
                mark()
            seq += 1
            if len(batch) == coalesce:
                yield b"".join(batch)
                batch = []
        if batch:
            yield b"".join(batch)
    if clock is not None:  # and for the one after it
        for _ in range(FRAMING_STEPS[1]):
            await clock.step()
    # Written before the terminal event is sent (see bench.token_times).
    times.save(response_id)

    text = b"".join(words[i % nwords] for i in range(n)).decode()
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    item = {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "content": [part],
        "role": "assistant",
    }
    yield _frame(
        "response.output_text.done",
        {
            "sequence_number": seq,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        },
    )
    yield _frame(
        "response.content_part.done",
        {
            "sequence_number": seq + 1,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
    )
    yield _frame(
        "response.output_item.done", {"sequence_number": seq + 2, "output_index": 0, "item": item}
    )
    usage = {
        "input_tokens": 16,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 16 + n,
    }
    completed = _response_object(response_id, created_at, model, n, "completed", [item], usage)
    yield _frame("response.completed", {"sequence_number": seq + 3, "response": completed})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
        status_code=status,
    )


def create_app(settings: NaiveSettings) -> Starlette:
    async def create_response(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            n = int(body.get("n", body.get("max_output_tokens") or 16))
        except (ValueError, TypeError, AttributeError):
            return _error(400, "body must be a JSON object with an integer max_output_tokens or n")
        if not body.get("stream"):
            return _error(400, 'the naive peer only streams; send "stream": true')
        if not 0 <= n <= MAX_TOKENS:
            return _error(400, f"n must be between 0 and {MAX_TOKENS}")
        model = str(body.get("model") or settings.model)
        return EventSourceResponse(
            _events(n, model, settings.coalesce, settings.token_times_dir, settings.clock),
            headers={"Content-Type": "text/event-stream; charset=utf-8"},
        )

    return Starlette(routes=[Route("/v1/responses", create_response, methods=["POST"])])


class _RawConnection(asyncio.Protocol):
    """``--raw``: HTTP/1.1 keep-alive, Content-Length request bodies, chunked SSE responses."""

    def __init__(self, settings: NaiveSettings) -> None:
        self._settings = settings
        self._transport: asyncio.Transport | None = None
        self._buf = b""
        self._busy = False
        self._writable: asyncio.Future[None] | None = None
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._busy:
            self._next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.resume_writing()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _next_request(self) -> None:
        i = self._buf.find(b"\r\n\r\n")
        if i < 0:
            return
        length = 0
        for line in self._buf[:i].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self._buf) < i + 4 + length:
            return
        body, self._buf = self._buf[i + 4 : i + 4 + length], self._buf[i + 4 + length :]
        self._busy = True
        asyncio.get_running_loop().create_task(self._respond(body))

    async def _respond(self, raw_body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        body = json.loads(raw_body)
        n = int(body.get("n", body.get("max_output_tokens") or 16))
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-store\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        events = _events(
            n,
            str(body.get("model") or self._settings.model),
            self._settings.coalesce,
            self._settings.token_times_dir,
            self._settings.clock,
        )
        async for frame in events:
            if self._closed:
                await events.aclose()
                return
            transport.write(b"%x\r\n%b\r\n" % (len(frame), frame))
            if self._writable is not None:
                await self._writable
        transport.write(b"0\r\n\r\n")
        self._busy = False
        self._next_request()


async def _serve_raw(settings: NaiveSettings, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _RawConnection(settings), host, port, backlog=2048)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.naive", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument(
        "--coalesce",
        type=int,
        default=1,
        help="delta frames per write (default 1: one write per event)",
    )
    parser.add_argument(
        "--token-delay-ms",
        type=float,
        default=0.0,
        help="pace the deltas: one per stream per step of this many ms (default 0)",
    )
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    parser.add_argument(
        "--raw",
        action="store_true",
        help="serve from a bare asyncio.Protocol instead of Starlette/uvicorn",
    )
    args = parser.parse_args(argv)
    if args.raw:
        settings = NaiveSettings.from_env(
            coalesce=args.coalesce, token_delay_ms=args.token_delay_ms
        )
        try:
            if args.loop == "asyncio":
                asyncio.run(_serve_raw(settings, args.host, args.port))
            else:
                _run_uvloop_if_available(_serve_raw(settings, args.host, args.port), args.loop)
        except KeyboardInterrupt:
            pass
        return
    app = create_app(
        NaiveSettings.from_env(coalesce=args.coalesce, token_delay_ms=args.token_delay_ms)
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop=args.loop,
        http=args.http,
    )


def _run_uvloop_if_available(coro: Coroutine[Any, Any, None], loop: str) -> None:
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise
        asyncio.run(coro)
        return
    uvloop.run(coro)


if __name__ == "__main__":
    main()

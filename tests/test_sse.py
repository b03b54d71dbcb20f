"""app.sse: a stream's four duties (body, disconnect, ping, shutdown) without a task group, and
a stream that ends leaving nothing for the garbage collector.

Most tests drive the response as an ASGI app with a hand-made receive and send (every message
seen, every moment chosen); the disconnect and the garbage are also driven over a real socket
through uvicorn."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from app import sse
from app.sse import EventStream
from tests.support.server import serve_in_loop

_SCOPE = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}


class _Client:
    """The server's side of one connection: what ``receive`` answers and what ``send`` saw. Like
    uvicorn, ``receive`` answers ``http.disconnect`` once the response is complete or the
    client has gone."""

    def __init__(self, *, refuse: bytes | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.refuse = refuse  # a body starting with this raises (a connection that failed)

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        body = message.get("body", b"")
        if self.refuse is not None and body.startswith(self.refuse):
            raise OSError("the connection is gone")
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.gone.set()

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


class _Frames:
    """A body iterator that yields ``frames``, then waits for ``release`` before it ends (or
    for ever); ``closed`` is set by its ``finally``."""

    def __init__(self, *frames: bytes, hold: bool = False) -> None:
        self.frames = frames
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        self.closed = asyncio.Event()

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for frame in self.frames:
                yield frame
            await self.release.wait()
        finally:
            self.closed.set()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def _held(client: _Client) -> tuple[_Frames, asyncio.Task[None]]:
    """A stream that sent its one frame and holds (its iterator waits), served in a task."""
    frames = _Frames(b"data: a\n\n", hold=True)
    call = asyncio.create_task(EventStream(frames())(_SCOPE, client.receive, client.send))
    await _until(lambda: len(client.bodies()) >= 1)
    return frames, call


def _tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t.get_name().startswith("app.sse.")}


async def test_a_stream_sends_its_frames_and_ends_with_nothing_left_running() -> None:
    client = _Client()
    frames = _Frames(b"data: a\n\n", b"data: b\n\n")
    await EventStream(frames())(_SCOPE, client.receive, client.send)
    assert client.sent[0]["type"] == "http.response.start"
    assert (b"cache-control", b"no-cache") in client.sent[0]["headers"]
    assert client.bodies() == [b"data: a\n\n", b"data: b\n\n", b""]
    await asyncio.sleep(0)  # the watcher's read is answered once the response is complete
    assert frames.closed.is_set() and not _tasks()


async def test_a_disconnect_cuts_the_stream_and_closes_its_iterator() -> None:
    client = _Client()
    frames, call = await _held(client)
    client.gone.set()  # the client went away mid-stream
    await asyncio.wait_for(call, 5)  # the call returns: it is not an error of the server's
    assert frames.closed.is_set()
    assert client.bodies() == [b"data: a\n\n"]  # no end was sent to a client that has gone
    assert not _tasks()


async def test_a_silent_stream_is_pinged_and_a_refused_ping_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "PING_S", 0.05)
    client = _Client()
    frames = _Frames(b"data: a\n\n", hold=True)
    call = asyncio.create_task(EventStream(frames())(_SCOPE, client.receive, client.send))
    await _until(lambda: sum(b.startswith(b": ping - ") for b in client.bodies()) >= 2)
    assert not call.done()
    frames.release.set()  # the stream ends: no ping after it
    await asyncio.wait_for(call, 5)
    assert client.bodies()[-1] == b"" and client.bodies()[0] == b"data: a\n\n"
    await asyncio.sleep(0.15)
    assert client.bodies()[-1] == b"" and not _tasks()

    refusing = _Client(refuse=b": ping")
    frames = _Frames(b"data: a\n\n", hold=True)
    await asyncio.wait_for(EventStream(frames())(_SCOPE, refusing.receive, refusing.send), 5)
    assert frames.closed.is_set() and refusing.bodies() == [b"data: a\n\n"]
    assert not _tasks()


async def test_shutdown_cuts_every_stream() -> None:
    client = _Client()
    frames, call = await _held(client)
    AppStatus.should_exit = True  # what uvicorn's exit signal sets (sse-starlette's watcher)
    try:
        await asyncio.wait_for(call, 5)
        assert frames.closed.is_set() and client.bodies() == [b"data: a\n\n"]
        assert not _tasks()
        # a stream that begins while the server exits ends at once
        late = _Frames(b"data: a\n\n", hold=True)
        await asyncio.wait_for(EventStream(late())(_SCOPE, client.receive, client.send), 5)
        assert late.closed.is_set()
    finally:
        AppStatus.should_exit = False
        await asyncio.sleep(0.6)  # sse-starlette's watcher stops; a later stream starts another


async def test_a_failing_iterator_raises_and_leaves_no_task_behind() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"data: a\n\n"
        raise ValueError("the body failed")

    client = _Client()
    with pytest.raises(ValueError, match="the body failed"):
        await EventStream(failing())(_SCOPE, client.receive, client.send)
    await asyncio.sleep(0)
    assert not _tasks()


async def test_a_cancellation_from_outside_is_not_swallowed() -> None:
    client = _Client()
    frames, call = await _held(client)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert frames.closed.is_set()
    await asyncio.sleep(0)
    assert not _tasks()


Make = Callable[[AsyncIterator[bytes]], EventSourceResponse]


def _app(make: Make, streams: list[_Frames]) -> Starlette:
    async def stream(request: Request) -> EventSourceResponse:
        hold = request.query_params.get("hold") == "1"
        frames = _Frames(b"data: a\n\n", b"data: b\n\n", hold=hold)
        streams.append(frames)
        return make(frames())

    return Starlette(routes=[Route("/", stream)])


async def _garbage_of_streams(make: Make) -> list[Any]:
    """Five streams made by ``make``, each read to its end through uvicorn with the collector
    off; then the streams (the responses the route returned) a collection finds unreachable."""
    streams: list[_Frames] = []
    gc.collect()
    gc.disable()
    try:
        async with serve_in_loop(_app(make, streams)) as url:
            async with httpx.AsyncClient() as http:
                for _ in range(5):
                    async with http.stream("GET", url) as answer:
                        assert (
                            b"".join([c async for c in answer.aiter_bytes()]).count(b"data:") == 2
                        )
            await asyncio.sleep(0.1)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, EventSourceResponse)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert len(streams) == 5 and all(s.closed.is_set() for s in streams)
    return found


async def test_streams_that_end_leave_no_cycle_for_the_collector() -> None:
    # sse-starlette's own response leaves each stream in a cycle (the measurement this module
    # answers); the test's instrument must see that, or it proves nothing about ours
    assert len(await _garbage_of_streams(EventSourceResponse)) == 5
    assert await _garbage_of_streams(EventStream) == []


async def test_a_silent_stream_over_a_real_socket_is_pinged_and_a_hang_up_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "PING_S", 0.05)
    streams: list[_Frames] = []
    async with serve_in_loop(_app(EventStream, streams)) as url:
        async with (
            httpx.AsyncClient() as http,
            http.stream("GET", url, params={"hold": "1"}) as answer,
        ):
            read = b""
            async for chunk in answer.aiter_bytes():
                read += chunk
                if b"data: b" in read and b"\n: ping - " in read.split(b"data: b", 1)[1]:
                    break  # a keep-alive comment after the frames, then the client hangs up
        await asyncio.wait_for(streams[0].closed.wait(), 5)
        assert not _tasks()

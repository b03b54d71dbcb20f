"""Server-sent event responses whose lifetime leaves no garbage for the collector.

sse-starlette's ``EventSourceResponse`` (pinned 3.7.0) runs each stream in an anyio task group of
four tasks (the body, a ping every 15 s, a shutdown listener, a disconnect listener) and ends it
by cancelling the group. Each cancelled task leaves ``CancelledError`` objects whose tracebacks
hold its frames, and the frames hold the stream: its response's run, its subscription, its
connection. So every stream that ended became a reference cycle that only the garbage collector
could free, whole. With 256 paced streams whose responses end and start together, a young-
generation collection then freed 10,000-29,000 objects and stopped the event loop for 55-90 ms
(the server's ``tune_gc`` thresholds), once a wave of responses: every live stream's next token
waited that long, and those pauses were the 256-stream benchmark's p99 latency (``bench/RESULTS.md``,
twenty-second session).

:class:`EventStream` sends the same bytes and keeps the same four duties, with one helper task
that ends by itself:

- **The body** is sent by the request's own task (sse-starlette's ``_stream_response``).
- **A disconnect** is watched by one task reading ``receive()`` until ``http.disconnect``. When
  the response completes, the server answers that read with ``http.disconnect`` (uvicorn and
  httpx's ASGI transport both do), so the task returns without being cancelled. A disconnect
  before the end cancels the body, as sse-starlette's group did.
- **A ping** every ``PING_S`` is a timer (``loop.call_later``), not a sleeping task; when it
  fires, a short task sends the comment under the response's send lock, as sse-starlette's
  ``_ping`` does, and sets the next one. A ping the connection refuses ends the stream.
- **Shutdown**: the stream registers with sse-starlette's own shutdown watcher (which looks at
  uvicorn's ``should_exit``), so a server that exits ends its streams exactly as before.

Only the body is cancelled, and only when a stream is cut short (disconnect, shutdown, a failed
ping): a stream that ends normally raises nothing anywhere. Streams over a WebSocket scope and
``HEAD`` requests take sse-starlette's own path. The module relies on sse-starlette 3.7.0's
``_stream_response``, ``_send_lock``, ``active``, ``_send_with_timeout`` and its shutdown state
(``_get_shutdown_state``, ``_ensure_watcher_started_on_this_loop``, ``AppStatus``);
``tests/test_sse.py`` drives each duty over a real socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import AppStatus, _ensure_watcher_started_on_this_loop, _get_shutdown_state

from app import transport

__all__ = ["PING_S", "EventStream"]

#: Seconds between keep-alive comments (sse-starlette's default, which proxies expect).
PING_S = 15.0

Send = Callable[[Any], Awaitable[None]]


class EventStream(EventSourceResponse):
    """An SSE response (``Cache-Control: no-cache``, a ping every ``PING_S``).

    sse-starlette wraps every chunk's send in an anyio cancel scope for its optional per-send
    timeout; we set no such timeout, so a chunk is sent directly (when an engine paces its
    tokens, every token is a chunk). A stuck client is handled by the transport
    (``app.transport``): a connection whose client reads nothing for ``send_stall_s`` is closed.

    A ``live`` stream (the creating POST's: every batch it sends is published to it whether it
    sends or not, so while its send waits they pile up in its subscription) does not wait for its
    client at all: it sends through ``transport.bounded_send``, which queues up to
    ``send_buffer_bytes`` in the transport and closes the connection beyond that; the disconnect
    ends the stream and its subscription."""

    def __init__(self, frames: AsyncIterator[bytes], *, live: bool = False) -> None:
        super().__init__(frames, ping=PING_S, headers={"Cache-Control": "no-cache"})
        self.live = live

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.live:
            send = transport.bounded_send(scope, send)
        if scope["type"] != "http" or scope["method"].upper() == "HEAD":
            await super().__call__(scope, receive, send)
            return
        life = _Lifetime(self, send)
        try:
            life.begin(receive)
            await self._stream_response(send)
            life.completed = True
        except asyncio.CancelledError:
            if not life.cut or life.body.uncancel() > 0:
                raise  # not (only) ours: the server's or a caller's cancellation
        finally:
            life.end()
        if self.background is not None:
            await self.background()

    async def _send_with_timeout(self, send: Send, message: Any) -> None:
        await send(message)  # (no send timeout: ``__init__`` takes none)

    def ping_frame(self) -> bytes:
        """The keep-alive comment, as sse-starlette's ``_ping`` makes it (no message factory:
        ``__init__`` takes none)."""
        return ensure_bytes(
            ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=self.sep),
            self.sep,
        )


class _Lifetime:
    """One stream's helpers: its disconnect watcher, its ping timer, its shutdown hook. ``cut``:
    the body was cancelled here (the stream was cut short); ``completed``: the body sent the
    response's end; ``done``: the body has returned or raised, and nothing here touches it any
    more."""

    __slots__ = (
        "body",
        "completed",
        "cut",
        "done",
        "pinging",
        "send",
        "stream",
        "timer",
        "watcher",
    )

    def __init__(self, stream: EventStream, send: Send) -> None:
        self.stream = stream
        self.send = send
        body = asyncio.current_task()
        assert body is not None
        self.body = body
        self.cut = False
        self.completed = False
        self.done = False
        self.watcher: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.pinging: asyncio.Task[None] | None = None

    def begin(self, receive: Any) -> None:
        loop = asyncio.get_running_loop()
        self.watcher = loop.create_task(self._watch(receive), name="app.sse.disconnect")
        self.timer = loop.call_later(PING_S, self._ping_due)
        _ensure_watcher_started_on_this_loop()
        # (its set is typed for anyio's Event; the watcher only calls ``set``)
        _get_shutdown_state().events.add(cast(Any, self))
        if AppStatus.should_exit:  # a stream begun during shutdown ends at once
            self.set()

    def end(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        _get_shutdown_state().events.discard(cast(Any, self))
        watcher = self.watcher
        if watcher is not None and not self.completed and not watcher.done():
            # Cut short, or the body failed, before the response's end: nothing may answer the
            # watcher's read until the server closes the connection (httpx's ASGI transport
            # never does), so it is stopped here. A stream that completes cancels nothing.
            watcher.cancel()

    def set(self) -> None:
        """sse-starlette's shutdown watcher calls this (it takes any object with ``set``)."""
        self._cut()

    def _cut(self) -> None:
        if not self.done and not self.cut:
            self.cut = True
            self.body.cancel()

    async def _watch(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.stream.active = False
        self._cut()

    def _ping_due(self) -> None:
        self.timer = None
        if not self.done:
            self.pinging = asyncio.get_running_loop().create_task(self._ping(), name="app.sse.ping")

    async def _ping(self) -> None:
        stream = self.stream
        try:
            async with stream._send_lock:
                if stream.active and not self.done:
                    await stream._send_with_timeout(
                        self.send,
                        {
                            "type": "http.response.body",
                            "body": stream.ping_frame(),
                            "more_body": True,
                        },
                    )
        except Exception:
            self._cut()  # the connection refused a ping: the stream ends as on a disconnect
            return
        finally:
            self.pinging = None
        if not self.done:
            self.timer = asyncio.get_running_loop().call_later(PING_S, self._ping_due)

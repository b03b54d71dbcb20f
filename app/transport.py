"""The HTTP transport: how the server runs under uvicorn, and the limits that keep one slow,
stalled or hostile client from harming the others.

Why this module exists: uvicorn (pinned 0.54.0) has no header-read timeout, no limit on the size
of a request head under httptools (h11 has one, answered 400), no cap on open connections (its
``limit_concurrency`` answers 503 to *requests* once that many connections are open, which
connections that never finish their head reach first, and the process's file descriptors still
run out: accept fails, and every new client waits), and its write flow control makes a
response's ``send()`` wait for as long as the client does not read. For a live stream that wait is
the problem: nothing is lost, but the batches published for that reader meanwhile pile up in its
subscription (``app.live.Subscription``), one copy of the whole response per stalled client.

What it adds, per connection, in one mixin over both of uvicorn's HTTP/1.1 protocols (h11 and
httptools; :func:`server` picks httptools when it is installed, like uvicorn's ``auto``, or the
one ``Settings.http_implementation`` names):

- **Header-read timeout**: a request head (a new connection's first one, or the next one on a
  keep-alive connection from its first byte) must arrive whole within ``http_header_timeout_s``;
  then 408 and the connection is closed (a connection that sent nothing is just closed).
- **Head size limit**: a head over ``http_max_head_bytes`` gets 431 and the connection is closed
  (counted on the raw bytes, the same for both parsers; h11's own limit is set to it too).
- **Idle keep-alive**: uvicorn's ``timeout_keep_alive``; an idle connection whose previous
  response is still unsent is aborted (``close()`` would wait for the client for ever).
- **Connection cap**: at most ``http_max_connections`` open connections (0: sized at start from
  the soft RLIMIT_NOFILE, which :func:`raise_fd_limit` first raises to the hard limit, less the
  descriptors start-up left open and a reserve). A connection over the cap makes room by closing
  one already answered (408, 431: they are read for a moment before the close, so the client
  gets the answer rather than a reset), or else the connection that has waited longest while
  reading a request head or idle between requests; only when every connection is busy with a
  request is the new one refused (503, Retry-After, closed at once).
- **Send bounds**: a connection whose write buffer stays above its high-water mark for
  ``send_stall_s`` (the client reads nothing) is aborted, whatever it was sending. A live stream
  (``app.http`` marks it through :func:`bounded_send`) does not wait for the client at all until
  ``send_buffer_bytes`` are queued for it, so its reader keeps taking the published batches and
  they queue in the transport, counted; a send over that bound aborts the connection instead of
  waiting. The response goes on (``store=true`` responses outlive their readers; see
  ``app.service``), and a client can resume it from the log.

A WebSocket upgrade (``app.websocket``) leaves these limits once its head is read: the
connection counts as busy until the socket closes (never evicted, no header timeout), and
uvicorn's WebSocket protocol bounds its sends itself (its write buffer and ping timeout).

A connection's control reaches the app as the ASGI scope extension ``EXTENSION``; without it
(another server, httpx's ASGI transport) :func:`bounded_send` returns ``send`` unchanged.

uvicorn internals relied on (checked against 0.54.0): ``Config(http=<protocol class>)``; the
protocols' constructor ``(config, server_state, app_state, _loop)``; their attributes
``transport``, ``flow`` (``FlowControl.write_paused``), ``cycle`` (``response_complete``,
``scope``), ``loop``, ``timeout_keep_alive``/``timeout_keep_alive_task``; the methods overridden
here (``connection_made``, ``connection_lost``, ``data_received``, ``pause_writing``,
``resume_writing``, ``on_response_complete``, ``timeout_keep_alive_handler``, and httptools'
parser callbacks ``on_message_begin``/``on_message_complete``); h11's ``conn.their_state``;
``RequestResponseCycle.send`` waiting on ``flow.drain()`` only while ``flow.write_paused``; and
``Server.startup`` binding the listening socket and returning without handling a connection.
:func:`body_writer` also reads the cycle's ``response_started``, ``response_complete``,
``disconnected`` and (httptools) ``chunked_encoding``, and frames a chunk as ``send`` does
(httptools: ``<size hex>\r\n<body>\r\n``; h11: ``conn.send(h11.Data(...))``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import h11
import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.errors import error_body
from app.settings import EVENT_LOOPS, HTTP_IMPLEMENTATIONS, Settings, SettingsError
from app.startup import cannot_listen

if TYPE_CHECKING:
    from uvicorn.protocols.http.flow_control import FlowControl

__all__ = [
    "EXTENSION",
    "Limits",
    "Server",
    "Stats",
    "body_writer",
    "bounded_send",
    "protocol_class",
    "raise_fd_limit",
    "run",
    "server",
]

log = logging.getLogger(__name__)

#: The ASGI scope extension holding the connection's control (see :func:`bounded_send`).
EXTENSION = "responses_ledger.transport"

#: Descriptors kept free under an automatic connection cap: the store's pool growing under load
#: (aiosqlite: three per connection), the engine, and the accept loop taking a burst of
#: connections before the first of them is counted.
_RESERVE_MIN = 64
_RESERVE_FRACTION = 8

_HEAD, _REQUEST, _IDLE = "head", "request", "idle"
#: How long a refused connection is read (and discarded) after its answer, so that closing it
#: does not reset the connection before the client reads the answer.
_LINGER_S = 2.0

Send = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    keep_alive_s: float
    max_head_bytes: int
    #: 0: sized from the file-descriptor limit at start.
    max_connections: int
    send_buffer_bytes: int
    send_stall_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            header_timeout_s=settings.http_header_timeout_s,
            keep_alive_s=settings.http_keep_alive_s,
            max_head_bytes=settings.http_max_head_bytes,
            max_connections=settings.http_max_connections,
            send_buffer_bytes=settings.send_buffer_bytes,
            send_stall_s=settings.send_stall_s,
        )


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (what production servers do at start: the
    soft default, often 1024, is a leftover of select()); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return int(soft if soft != resource.RLIM_INFINITY else target)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning(
            "could not raise the file-descriptor limit from %d to %d: %s", soft, target, exc
        )
        return int(soft)
    return int(target)


def _open_fds() -> int | None:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder)) - 1  # less the one listdir opened
        except OSError:
            continue
    return None


@dataclass
class Stats:
    """What the limits did (counters since start; tests and benchmarks read them)."""

    evicted: int = 0
    refused: int = 0
    head_timeouts: int = 0
    head_too_large: int = 0
    cut_send_buffer: int = 0
    cut_stalled: int = 0
    #: Live streams whose batches were written straight from their commits (``body_writer``).
    written_direct: int = 0


class _Connections:
    """The server's connections as the cap sees them: how many are open, and those waiting for
    a request (reading its head, or idle), longest-waiting first."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.cap: int | None = None  # set by size() once the server listens
        self.open = 0
        self.stats = Stats()
        self._waiting: dict[_Guard, None] = {}  # insertion order: longest-waiting first
        self._lingering: dict[_Guard, None] = {}  # answered (408, 431), read until they close

    def size(self, connections_now: int) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        soft = int(soft) if soft != resource.RLIM_INFINITY else 1 << 20
        used = _open_fds()
        fits = (
            None
            if used is None
            else soft - (used - connections_now) - max(_RESERVE_MIN, soft // _RESERVE_FRACTION)
        )
        if self.limits.max_connections > 0:
            self.cap = self.limits.max_connections
            if fits is not None and self.cap > fits:
                log.warning(
                    "http_max_connections=%d is more than the file-descriptor limit (%d, %d in use) leaves room for (%d)",
                    self.cap,
                    soft,
                    used,
                    fits,
                )
        elif fits is not None:
            self.cap = max(fits, 16)
        log.info(
            "connection cap: %s (file-descriptor limit %d, %s in use at start)",
            self.cap,
            soft,
            used,
        )

    def admit(self, conn: _Guard) -> bool:
        """Count a new connection; over the cap, close a lingering one or else the
        longest-waiting one to make room. False: the cap is reached and every connection is busy
        with a request."""
        self.open += 1
        if self.cap is None or self.open <= self.cap:
            return True
        for queue in (self._lingering, self._waiting):
            if queue:
                oldest = next(iter(queue))
                self.stats.evicted += 1
                oldest.evict()
                return True
        self.stats.refused += 1
        return False

    def waiting(self, conn: _Guard) -> None:
        self._waiting.pop(conn, None)
        self._waiting[conn] = None

    def busy(self, conn: _Guard) -> None:
        self._waiting.pop(conn, None)
        self._lingering.pop(conn, None)

    def linger(self, conn: _Guard) -> None:
        self._waiting.pop(conn, None)
        self._lingering[conn] = None

    def gone(self, conn: _Guard) -> None:
        self._waiting.pop(conn, None)
        self._lingering.pop(conn, None)
        self.open -= 1


def _blank_line(buf: bytes) -> int:
    """The index just past the blank line that ends a request head in ``buf``, or -1."""
    ends = [i + n for i, n in ((buf.find(b"\n\r\n"), 3), (buf.find(b"\n\n"), 2)) if i >= 0]
    return min(ends) if ends else -1


def _answer(
    status: int, reason: str, message: str, code: str, *, retry_after: int | None = None
) -> bytes:
    body = json.dumps(
        error_body(
            message, "server_error" if status >= 500 else "invalid_request_error", None, code
        )
    ).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Guard:
    """The limits, mixed in before one of uvicorn's HTTP/1.1 protocol classes."""

    if TYPE_CHECKING:  # what uvicorn's protocol classes provide
        transport: asyncio.Transport
        flow: FlowControl
        loop: asyncio.AbstractEventLoop
        cycle: Any
        timeout_keep_alive: int  # a float in fact (uvicorn's annotation)
        timeout_keep_alive_task: asyncio.TimerHandle | None

    def __init__(
        self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]
        self._connections: _Connections = config.connections
        self._limits = self._connections.limits
        self._phase = _HEAD
        self._head_bytes = 0
        self._head_tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._seen_cycle: Any = None
        self._live = False
        self._high_water = 0
        self._done = False  # refused, answered or cut: nothing more is read
        self._counted = False

    # -- uvicorn's protocol interface -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._high_water = self.transport.get_write_buffer_limits()[1]
        self._counted = True
        if not self._connections.admit(self):
            # closed at once: refused connections must not hold descriptors the cap counts on
            self._reject(
                503,
                "Service Unavailable",
                "The server has too many open connections; retry shortly.",
                "too_many_connections",
                retry_after=1,
                linger=False,
            )
            return
        self._wait(_HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._connections.gone(self)
        self._cancel_timers()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._done:
            return  # lingering after an answer: discard
        if self._phase is _IDLE:
            self._wait(_HEAD)  # the next request's head: header_timeout_s from its first byte
        if self._phase is _HEAD and not self._count_head(data):
            return
        super().data_received(data)  # type: ignore[misc]
        self._sync()

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """A WebSocket upgrade (``app.websocket``) hands the socket to uvicorn's WebSocket
        protocol: this connection is busy from now on (never evicted, no head timer left to
        answer 408 into the socket) and is counted gone when that protocol loses it."""
        self._busy()
        self._cancel_timers()
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]
        upgraded = self.transport.get_protocol()
        if upgraded is self:  # type: ignore[comparison-overlap]  # (a uvicorn protocol is mixed in)
            return
        lost = upgraded.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            if self._counted:
                self._counted = False
                self._connections.gone(self)
            lost(exc)

        upgraded.connection_lost = connection_lost  # type: ignore[method-assign]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self._limits.send_stall_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def on_response_complete(self) -> None:
        if self._live:
            self._live = False
            if not self.transport.is_closing():
                self.transport.set_write_buffer_limits(high=self._high_water)
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        self._sync()
        if self.cycle.response_complete and self._request_read():
            self._wait(_IDLE)

    def timeout_keep_alive_handler(self) -> None:
        if self.transport.get_write_buffer_size() > 0:
            self.transport.abort()  # the previous response is still unread: close() would wait
            return
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    # -- the app's side ---------------------------------------------------------------------------

    def bounded_send(self, send: Send) -> Send:
        """``send`` for a live stream on this connection (see :func:`bounded_send`)."""
        self._live = True
        self.transport.set_write_buffer_limits(high=self._limits.send_buffer_bytes)
        flow = self.flow

        async def send_bounded(message: Any) -> None:
            if (
                flow.write_paused
                and message.get("more_body", False)
                and not self.transport.is_closing()
            ):
                self._cut_send_buffer()
            await send(message)  # after a cut it returns once uvicorn sees the connection lost

        return send_bounded

    def _cut_send_buffer(self) -> None:
        """Close a live stream whose client left more than ``send_buffer_bytes`` unread."""
        log.info(
            "closing a stream whose client has %d bytes unread (send_buffer_bytes=%d)",
            self.transport.get_write_buffer_size(),
            self._limits.send_buffer_bytes,
        )
        self._connections.stats.cut_send_buffer += 1
        self._cut()

    def body_writer(self) -> Callable[[bytes], bool] | None:
        """Write one body chunk of the live stream now, without the ASGI ``send`` chain (see
        :func:`body_writer`). Only for a stream that :meth:`bounded_send` marked live."""
        cycle = self.cycle
        if not self._live or cycle is None or not cycle.response_started:
            return None
        frame = self._body_framer(cycle)
        if frame is None:
            return None
        flow, transport = self.flow, self.transport
        self._connections.stats.written_direct += 1

        def write(body: bytes) -> bool:
            if (
                self.cycle is not cycle
                or cycle.response_complete
                or cycle.disconnected
                or transport.is_closing()
            ):
                return False
            if flow.write_paused:  # more than send_buffer_bytes unread: what send_bounded does
                self._cut_send_buffer()
                return False
            transport.write(frame(body))
            return True

        return write

    def _body_framer(self, cycle: Any) -> Callable[[bytes], bytes] | None:
        """How this protocol frames a body chunk of ``cycle``'s response on the wire (None:
        only its own ``send`` can write it)."""
        raise NotImplementedError

    # -- the limits -------------------------------------------------------------------------------

    def _request_read(self) -> bool:
        """The current request has been read whole (so the next bytes start a new head)."""
        raise NotImplementedError

    def _sync(self) -> None:
        """Follow the parser: a new request cycle means its head is complete."""
        cycle = self.cycle
        if cycle is None:
            return
        if cycle is not self._seen_cycle:
            self._seen_cycle = cycle
            cycle.scope.setdefault("extensions", {})[EXTENSION] = self
            if not cycle.response_complete:
                self._busy()
        elif self._phase is _REQUEST and cycle.response_complete and self._request_read():
            # answered before its body was read whole; the body has arrived now
            self._wait(_IDLE)
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )

    def _wait(self, phase: str) -> None:
        self._phase = phase
        self._connections.waiting(self)
        self._head_bytes = 0
        self._head_tail = b""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if phase is _HEAD:
            self._head_timer = self.loop.call_later(
                self._limits.header_timeout_s, self._head_timed_out
            )

    def _busy(self) -> None:
        self._phase = _REQUEST
        self._connections.busy(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _count_head(self, data: bytes) -> bool:
        scan = self._head_tail + data if self._head_tail else data
        end = _blank_line(scan)
        if end >= 0:
            self._head_bytes += end - len(self._head_tail)
            self._head_tail = b""
        else:
            self._head_bytes += len(data)
            self._head_tail = scan[-3:]
        if self._head_bytes > self._limits.max_head_bytes:
            self._connections.stats.head_too_large += 1
            self._reject(
                431,
                "Request Header Fields Too Large",
                f"The request head is larger than {self._limits.max_head_bytes} bytes.",
                "request_header_fields_too_large",
            )
            return False
        return True

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._phase is not _HEAD or self.transport.is_closing():
            return
        self._connections.stats.head_timeouts += 1
        if self._head_bytes == 0 and not self._head_tail:
            self._close()  # nothing sent: like an idle keep-alive connection
            return
        self._reject(
            408,
            "Request Timeout",
            f"The request head did not arrive within {self._limits.header_timeout_s:g} seconds.",
            "request_timeout",
        )

    def _stalled(self) -> None:
        self._stall_timer = None
        if self.transport.is_closing():
            return
        log.info(
            "closing a connection whose client read nothing for %g s (%d bytes unsent)",
            self._limits.send_stall_s,
            self.transport.get_write_buffer_size(),
        )
        self._connections.stats.cut_stalled += 1
        self._cut()

    def evict(self) -> None:
        """Make room for a new connection (this one is reading a head, idle, or lingering)."""
        self._connections.busy(self)
        self._close()

    def _reject(
        self,
        status: int,
        reason: str,
        message: str,
        code: str,
        *,
        retry_after: int | None = None,
        linger: bool = True,
    ) -> None:
        """Answer ``status`` and close; with ``linger``, what the client still sends is read
        and discarded for a moment first, so the close does not reset the connection before it
        reads the answer (such a connection is the first to make room under the cap)."""
        self._done = True
        self._cancel_timers()
        transport = self.transport
        transport.write(_answer(status, reason, message, code, retry_after=retry_after))
        if linger and transport.can_write_eof():
            self._connections.linger(self)
            transport.write_eof()
            self.loop.call_later(_LINGER_S, self._close)
        else:
            self._connections.busy(self)
            transport.close()

    def _close(self) -> None:
        if self.transport.is_closing():
            return
        self._done = True
        if self.transport.get_write_buffer_size() > 0:
            self.transport.abort()
        else:
            self.transport.close()

    def _cut(self) -> None:
        self._done = True
        self._cancel_timers()
        self.transport.abort()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._stall_timer = None


class _H11(_Guard, H11Protocol):
    parser_name = "h11"

    def _request_read(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _body_framer(self, cycle: Any) -> Callable[[bytes], bytes] | None:
        conn = self.conn
        return lambda body: conn.send(h11.Data(data=body))  # h11 keeps the framing's state


@functools.cache
def _httptools_class() -> type[asyncio.Protocol] | None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class _HttpTools(_Guard, HttpToolsProtocol):
        parser_name = "httptools"
        _message_read = True

        def _request_read(self) -> bool:
            return self._message_read

        def on_message_begin(self) -> None:
            self._message_read = False
            super().on_message_begin()

        def on_message_complete(self) -> None:
            self._message_read = True
            super().on_message_complete()

        def _body_framer(self, cycle: Any) -> Callable[[bytes], bytes] | None:
            # what RequestResponseCycle.send writes for a chunk with more to come
            if not cycle.chunked_encoding or cycle.scope["method"] == "HEAD":
                return None
            return lambda body: b"%x\r\n%b\r\n" % (len(body), body)

    return _HttpTools


def protocol_class(implementation: str) -> type[asyncio.Protocol]:
    """``auto`` (httptools when installed, else h11), ``h11`` or ``httptools``."""
    if implementation not in HTTP_IMPLEMENTATIONS:  # (a Settings made in code)
        raise ValueError(f"http implementation {implementation!r}: use auto, h11 or httptools")
    if implementation == "h11":
        return _H11
    found = _httptools_class()
    if found is None:
        if implementation == "httptools":
            raise ValueError("http implementation 'httptools': httptools is not installed")
        return _H11
    return found


def loop_name(choice: str) -> str:
    """uvicorn's ``loop`` for ``Settings.event_loop``: ``auto`` (uvloop when installed, else
    asyncio's), ``uvloop`` or ``asyncio``. uvloop is a dependency: on asyncio's loop (and h11) a
    paced token cost the server 5-36 % more CPU (bench/RESULTS.md, twenty-ninth session), and the
    256-stream p99 was 3-4 ms later on asyncio's loop alone (twenty-eighth)."""
    if choice not in EVENT_LOOPS:  # (a Settings made in code, not read from the environment)
        raise SettingsError(f"event loop {choice!r}: use auto, uvloop or asyncio")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise SettingsError(
                "event loop 'uvloop': uvloop is not installed (RESPONSES_LEDGER_EVENT_LOOP=uvloop;"
                " install the package's dependencies, or use auto)"
            ) from None
        return "asyncio"
    return "uvloop"


class _Config(uvicorn.Config):
    def __init__(
        self,
        app: Any,
        *,
        connections: _Connections,
        settings: Settings,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.connections = connections
        #: What the server was asked for (``auto``: whatever is installed), for the start-up line.
        self.settings = settings


class Server(uvicorn.Server):
    """uvicorn's server, sizing the connection cap once it listens (start-up has opened the
    store and the engine by then, so their descriptors are known)."""

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        self.connections = config.connections

    @property
    def stats(self) -> Stats:
        return self.connections.stats

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.connections.size(len(self.server_state.connections))
        # what it runs on, read from the running loop and the protocol in use: a server that
        # lacks uvloop or httptools (an install without the dependencies) says so at start
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        parser = getattr(self.config.http, "parser_name", "?")
        asked = cast(_Config, self.config).settings
        fallback = asked.event_loop == "auto" and loop != "uvloop"
        fallback = fallback or (asked.http_implementation == "auto" and parser != "httptools")
        log.log(
            logging.WARNING if fallback else logging.INFO,
            "event loop: %s; HTTP parser: %s%s",
            loop,
            parser,
            " (uvloop and httptools are not both installed: install the package's dependencies;"
            " every benchmark figure was measured with them)"
            if fallback
            else "",
        )

    def handle_exit(self, sig: int, frame: Any) -> None:
        """The first SIGTERM drains (``app.drain``) before uvicorn's own shutdown; another
        signal (or SIGINT) is uvicorn's: stop now."""
        service = _service_of(self.config.app)
        if sig != signal.SIGTERM or self._draining or service is None or not self.started:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        loop = asyncio.get_event_loop()

        def start() -> None:  # kept: the loop holds only a weak reference to a task
            self._drain_task = loop.create_task(self._drain(service), name="app.drain")

        loop.call_soon_threadsafe(start)

    async def _drain(self, service: Any) -> None:
        try:
            await service.drain.run(service)
        except Exception:
            logging.getLogger(__name__).exception("drain failed; shutting down")
        self.should_exit = True

    _draining = False
    _drain_task: asyncio.Task[None] | None = None


def server(
    app: Any,
    settings: Settings,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str | None = None,
    own_logging: bool = False,
) -> Server:
    """The uvicorn server for ``app`` with the transport settings: what ``responses-ledger
    serve`` runs, and what the tests' in-process servers run."""
    limits = Limits.from_settings(settings)
    raise_fd_limit()
    connections = _Connections(limits)
    config = _Config(
        app,
        connections=connections,
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
        log_level=(log_level or settings.log_level).lower(),
        access_log=False,  # app.logs writes the line per request
        # ``serve`` configured logging (app.logs): uvicorn's loggers write through it
        log_config=None if own_logging else LOGGING_CONFIG,
        lifespan="on",
        loop=loop_name(settings.event_loop),
        http=protocol_class(settings.http_implementation),
        settings=settings,
        timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]  # a float works
        h11_max_incomplete_event_size=limits.max_head_bytes,
    )
    return Server(config)


def _service_of(app: Any) -> Any:
    """The ``ResponseService`` of the Starlette app uvicorn serves, once started."""
    state = getattr(app, "state", None)
    return getattr(state, "service", None) if state is not None else None


def bounded_send(scope: Any, send: Send) -> Send:
    """``send`` for a live stream: it never waits for the client while less than
    ``send_buffer_bytes`` are queued for it, and closes the connection instead of waiting once
    more are (the stream's reader then ends and unsubscribes). Without this module's protocol
    underneath (no ``EXTENSION`` in the scope), ``send`` itself."""
    connection = scope.get("extensions", {}).get(EXTENSION)
    if connection is None:
        return send
    bounded: Send = connection.bounded_send(send)
    return bounded


def body_writer(scope: Any) -> Callable[[bytes], bool] | None:
    """For a live stream whose ``send`` is :func:`bounded_send`'s: a function that writes one
    body chunk to the connection at once, from wherever it is called (a commit's callback), with
    no task, no ``await`` and none of the middleware's ``send`` wrappers in between. It keeps
    ``bounded_send``'s bound: past ``send_buffer_bytes`` unread it closes the connection. It
    returns False (and writes nothing) once the response has not begun, is complete, or its
    connection is gone or cut: the caller then sends through ASGI again, which sees why.

    The chunk is framed as uvicorn frames it (chunked encoding; h11 through its own state), so
    the wire is byte for byte what ``send`` would have written. None without this module's
    protocol underneath, or when the response is not chunked."""
    connection = scope.get("extensions", {}).get(EXTENSION)
    if connection is None:
        return None
    writer: Callable[[bytes], bool] | None = connection.body_writer()
    return writer


def run(app: Any, settings: Settings) -> None:
    """Serve until stopped (exit status 3 if the server did not start, as ``uvicorn.run``).
    Stopped by SIGINT (Ctrl-C), it shuts down (uvicorn's shutdown, without the drain SIGTERM
    starts) and returns: uvicorn raises the signal again once it has shut down, which asyncio
    turns into a ``KeyboardInterrupt`` whose traceback would follow "Finished server process"
    (``uvicorn.run`` swallows it too)."""
    try:  # (uvicorn says "[Errno -2] Name or service not known", without the name)
        socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise cannot_listen(settings.host, settings.port, exc) from None
    the_server = server(app, settings, own_logging=True)
    with contextlib.suppress(KeyboardInterrupt):
        the_server.run()
    if not the_server.started:
        sys.exit(3)

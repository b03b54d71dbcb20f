"""A load generator for ``POST /v1/responses`` SSE streams, cheap enough to out-run one server core.

It runs in its own process (the harness pins it to its own core) and opens ``C`` keep-alive
HTTP/1.1 connections; each connection issues ``K`` streaming requests one after the other, so
``C`` streams are in flight at all times (a closed loop). With ``--arrival-rate`` the loop is
open instead: ``C x K`` streams start as a Poisson process of that rate whatever the server's
pace, on whichever connection is free, as a public service's requests arrive; a server that
falls behind then holds more streams, not fewer. Every stream is read to its end.

Why a hand-rolled client: a general HTTP client plus an SSE parser costs tens of microseconds per
event in Python, as much as the server being measured, so the load generator would become the
bottleneck. Here each ``data_received`` call (which usually carries many events under load) costs
a few ``bytes`` operations whatever the number of events in it:

- chunked transfer coding is undone chunk by chunk (sizes parsed, payload sliced);
- SSE frames are counted, not parsed: the count of frame separators (``\\n\\n`` or
  ``\\r\\n\\r\\n``, detected on the first frame) minus comment frames; delta events are counted as
  occurrences of ``.delta"`` (the end of a ``"type":"response.*.delta"`` value), and each is one
  token, unless a *token marker* is given: a server that puts several tokens in one delta (the
  ledger, whose deltas carry every token that waited for a commit) is then counted in the marker's
  occurrences in its delta frames (the benchmark's scripted text is one ``" word"`` a token);
- one regex search per read checks ``sequence_number``: the last complete frame's number must
  equal the number of events read so far minus one, so numbers are 0-based and contiguous and an
  event's ``sequence_number`` is its ordinal in the stream;
- the first frame is parsed as JSON once per stream, for ``response.id``; the last frame's type
  must be ``response.completed``, and the event count must equal the expected count when given.

Read times are ``time.monotonic_ns()`` taken once per ``data_received`` and stored per read as
(time, tokens so far), so the ``i``-th token's read time is that of the read that completed it.
With ``--token-times-dir`` the server's side files (:mod:`bench.token_times`) are joined after
the run to give the latency from the engine yielding a token to the client reading its delta.

The JSON report: delivered tokens/s (delta events read, all streams, over the wall time from the
first request to the last stream's end), events/s, stream count, errors, per-stream event counts,
latency percentiles and samples, time to first delta, and the load generator's own CPU time over
the same window (if its CPU use approaches its wall time, the load generator is the bottleneck).
``latency_mid_ms`` is the latency of every stream's deltas but its first and last ten
(``MID_EDGE``): a stream's steady state. When the streams start and end together (the benchmark's
default), the first and last tokens of each wait behind the other streams' set-ups and endings,
and they are most of the slowest 1%.

Run: ``python -m bench.loadgen --url http://127.0.0.1:8123 --concurrency 16 --streams-per-worker
4 --body '{"model":"gpt-oss-20b","input":"hi","stream":true,"max_output_tokens":1000}'
--expected-events 1008``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import resource
import sys
import time
from array import array
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from time import monotonic_ns
from typing import Any
from urllib.parse import urlsplit

from bench import token_times
from bench.stats import percentiles

__all__ = ["LoadConfig", "StreamReader", "main", "run_load"]

_SEQ = re.compile(rb'"sequence_number"\s*:\s*(\d+)')
_TYPE = re.compile(rb'"type"\s*:\s*"([^"]+)"')
_DELTA = b'.delta"'
_MAX_ERROR_BODY = 2048


class StreamReader:
    """Reads one HTTP/1.1 response carrying an SSE stream; fed raw bytes as they arrive.

    Pure (no I/O), so it is tested by feeding it a recorded response split at every offset.
    """

    __slots__ = (
        "_body_done",
        "_cbuf",
        "_head",
        "_last_frame",
        "_length_left",
        "_sbuf",
        "batch_deltas",
        "batch_ns",
        "chunked",
        "delta_events",
        "deltas",
        "done",
        "error",
        "error_body",
        "events",
        "expected_events",
        "expected_tokens",
        "first_delta_ns",
        "last_type",
        "response_id",
        "sep",
        "status",
        "t_end",
        "t_start",
        "token_marker",
        "until_close",
    )

    def __init__(
        self,
        expected_events: int | None = None,
        token_marker: bytes | None = None,
        expected_tokens: int | None = None,
    ) -> None:
        self.expected_events = expected_events
        self.token_marker = token_marker
        self.expected_tokens = expected_tokens
        self._head: bytes | None = b""
        self.status = 0
        self.chunked = False
        self.until_close = False
        self._length_left = 0
        self._body_done = False
        self._cbuf = b""
        self._sbuf = b""
        self._last_frame = b""
        self.sep: bytes | None = None
        self.events = 0
        self.deltas = 0  # tokens read: a delta event each, or the token marker's occurrences
        self.delta_events = 0
        self.batch_ns = array("q")  # read time of each read that completed >= 1 delta
        self.batch_deltas = array("q")  # tokens read so far, after that read
        self.response_id: str | None = None
        self.last_type: str | None = None
        self.error: str | None = None
        self.error_body = b""
        self.done = False
        self.t_start = 0
        self.first_delta_ns = 0
        self.t_end = 0

    # -- feeding ---------------------------------------------------------------------------------

    def feed(self, data: bytes, now: int) -> None:
        if self.done:
            if data.strip():
                self._fail("bytes after the end of the response")
            return
        if self._head is not None:
            head = self._head + data
            i = head.find(b"\r\n\r\n")
            if i < 0:
                if len(head) > 65536:
                    self._fail("response head too long")
                    self._finish(now)
                    return
                self._head = head
                return
            self._head = None
            self._parse_head(head[:i])
            data = head[i + 4 :]
            if self.done:
                return
        if self.chunked:
            body = self._dechunk(data)
            finished = self._body_done
        elif self.until_close:
            body, finished = data, False
        else:
            body = data[: self._length_left]
            self._length_left -= len(body)
            finished = self._length_left == 0
        if body:
            if self.status == 200:
                self._sse(body, now)
            elif len(self.error_body) < _MAX_ERROR_BODY:
                self.error_body += body[: _MAX_ERROR_BODY - len(self.error_body)]
        if finished:
            self._finish(now)

    def connection_closed(self, now: int) -> None:
        if self.done:
            return
        if not self.until_close:
            self._fail("connection closed before the end of the response")
        self._finish(now)

    # -- HTTP ------------------------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            self.status = int(parts[1])
        except (IndexError, ValueError):
            self._fail(f"bad status line {lines[0][:80]!r}")
            self._finish(0)
            return
        length: int | None = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif name == b"content-length":
                length = int(value.strip())
        if self.chunked:
            return
        if length is None:
            self.until_close = True
        else:
            self._length_left = length
            if length == 0:
                self._finish(0)

    def _dechunk(self, data: bytes) -> bytes:
        """Undo chunked transfer coding, whole chunks at a time; sets ``_body_done`` at the end.

        A chunk that has not fully arrived stays in ``_cbuf`` until it has: simpler and cheaper
        per chunk than emitting partial chunks, and chunks are one server write each.
        """
        buf = self._cbuf + data if self._cbuf else data
        end = len(buf)
        pos = 0
        out: list[bytes] = []
        find = buf.find
        while True:
            nl = find(b"\r\n", pos)
            if nl < 0:
                break
            try:
                size = int(buf[pos:nl], 16)
            except ValueError:  # chunk extensions
                size = int(buf[pos:nl].split(b";", 1)[0], 16)
            start = nl + 2
            stop = start + size
            if stop + 2 > end:
                break
            if size == 0:  # the last chunk, then trailer fields (usually none), then CRLF
                if find(b"\r\n\r\n", nl) < 0:
                    break
                self._body_done = True
                pos = end
                break
            out.append(buf[start:stop])
            pos = stop + 2
        self._cbuf = buf[pos:] if pos < end else b""
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    # -- SSE -------------------------------------------------------------------------------------

    def _sse(self, body: bytes, now: int) -> None:
        if self._sbuf:
            body = self._sbuf + body
        sep = self.sep
        if sep is None:
            lf = body.find(b"\n\n")
            crlf = body.find(b"\r\n\r\n")
            if lf < 0 and crlf < 0:
                self._sbuf = body
                return
            sep = self.sep = b"\r\n\r\n" if crlf >= 0 and (lf < 0 or crlf < lf) else b"\n\n"
        end = body.rfind(sep)
        if end < 0:
            self._sbuf = body
            return
        cut = end + len(sep)
        if cut == len(body):
            complete = body
            self._sbuf = b""
        else:
            complete = body[:cut]
            self._sbuf = body[cut:]
        n = complete.count(sep)
        if complete[:1] == b":":  # a comment frame (sse-starlette's ping)
            n -= 1
        comment_marker = sep + b":"
        if comment_marker in complete:
            n -= complete.count(comment_marker)
        if n <= 0:
            return
        if self.events == 0:
            self._first_frame(complete[: complete.find(sep)])
        self.events += n
        d = complete.count(_DELTA)
        if d:
            self.delta_events += d
            marker = self.token_marker
            if marker is not None:
                # only deltas here (the steady state): one count; else only the deltas' frames
                if d == n:
                    d = complete.count(marker)
                else:
                    d = sum(frame.count(marker) for frame in complete.split(sep) if _DELTA in frame)
            self.deltas += d
            self.batch_ns.append(now)
            self.batch_deltas.append(self.deltas)
            if not self.first_delta_ns:
                self.first_delta_ns = now
        k = complete.rfind(sep, 0, cut - len(sep))
        last = complete[k + len(sep) :] if k >= 0 else complete
        if last[:1] == b":":
            return
        self._last_frame = last
        m = _SEQ.search(last)
        if m is not None and int(m.group(1)) != self.events - 1 and self.error is None:
            self._fail(f"sequence_number {int(m.group(1))} on event #{self.events - 1}")

    def _first_frame(self, frame: bytes) -> None:
        for line in frame.splitlines():
            if line.startswith(b"data:"):
                try:
                    event = json.loads(line[5:])
                    self.response_id = event["response"]["id"]
                except (ValueError, KeyError, TypeError):
                    self._fail(f"first event has no response.id: {frame[:200]!r}")
                return
        self._fail(f"first event has no data line: {frame[:200]!r}")

    # -- the end ---------------------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def _finish(self, now: int) -> None:
        self.done = True
        self.t_end = now
        if self.status != 200:
            self._fail(f"HTTP {self.status}: {self.error_body[:300]!r}")
            return
        if self._sbuf.strip():
            self._fail(f"stream ended inside a frame: {self._sbuf[:120]!r}")
        m = _TYPE.search(self._last_frame)
        self.last_type = m.group(1).decode() if m else None
        if self.last_type != "response.completed":
            self._fail(f"last event is {self.last_type!r}, not 'response.completed'")
        if self.expected_events is not None and self.events != self.expected_events:
            self._fail(f"{self.events} events, expected {self.expected_events}")
        if self.expected_tokens is not None and self.deltas != self.expected_tokens:
            self._fail(f"{self.deltas} tokens in the deltas, expected {self.expected_tokens}")


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: StreamReader | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            return
        reader.feed(data, monotonic_ns())
        if reader.done:
            self._release()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reader is not None:
            self.reader.connection_closed(monotonic_ns())
            self._release()

    def _release(self) -> None:
        self.reader = None
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def exchange(self, request: bytes, reader: StreamReader, timeout: float) -> None:
        assert self.transport is not None
        self.reader = reader
        self.waiter = asyncio.get_running_loop().create_future()
        reader.t_start = monotonic_ns()
        self.transport.write(request)
        try:
            await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError:
            reader._fail(f"no end of stream after {timeout} s")
            reader.done = True
            reader.t_end = monotonic_ns()
            self.reader = None
            self.transport.close()
            self.closed = True


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    body: bytes
    concurrency: int = 1
    streams_per_worker: int = 1
    #: Stop starting new streams after this many seconds (streams in flight still finish).
    max_seconds: float | None = None
    expected_events: int | None = None
    #: Count tokens as this byte string's occurrences in the delta frames (None: a token a delta).
    token_marker: bytes | None = None
    expected_tokens: int | None = None
    token_times_dir: Path | None = None
    token_offset: int = 0
    timeout_s: float = 300.0
    samples: int = 1000
    #: Worker ``i`` waits ``i * stagger_s / concurrency`` before its first request: the streams'
    #: starts, and so their ends, are spread over ``stagger_s`` instead of all coming at once.
    stagger_s: float = 0.0
    #: Open loop: new streams arrive as a Poisson process at this many a second whatever the
    #: server's pace, ``concurrency * streams_per_worker`` of them (0: closed loop, each of the
    #: ``concurrency`` workers starting its next stream when its last has ended). Streams share
    #: keep-alive connections, ``concurrency`` opened first and more when all are busy.
    arrival_rate: float = 0.0
    #: The seed of the open loop's arrival times (the same seed, the same schedule).
    arrival_seed: int = 0
    #: Latency and time to first delta count only the streams that start this long after the
    #: run does (an open loop starts empty and fills for one stream's duration).
    measure_from_s: float = 0.0

    def request_bytes(self) -> bytes:
        parts = urlsplit(self.url)
        path = parts.path if parts.path not in ("", "/") else "/v1/responses"
        return (
            f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: bench.loadgen\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(self.body)}\r\n\r\n"
        ).encode() + self.body


async def _connect(host: str, port: int) -> _Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(_Connection, host, port)
    return conn


def _summary_ms(values_ns: array) -> dict[str, float | int]:
    p50, p90, p99, most = percentiles(values_ns, 0.50, 0.90, 0.99, 1)
    return {
        "n": len(values_ns),
        "p50": p50 / 1e6,
        "p90": p90 / 1e6,
        "p99": p99 / 1e6,
        "max": most / 1e6,
    }


async def _wait_for_times(directory: Path, ids: set[str], deadline_s: float) -> dict[str, array]:
    """Every response's token times in ``directory``, once all of ``ids`` are there or
    ``deadline_s`` has passed (a server appends a response's record before its terminal event,
    so after the run they are nearly always there at once)."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = token_times.read_all(directory)
        if ids <= found.keys() or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(0.05)


#: Deltas left out at each end of a stream for ``latency_mid_ms``.
MID_EDGE = 10


async def _latency(config: LoadConfig, readers: list[StreamReader]) -> dict:
    assert config.token_times_dir is not None
    directory = config.token_times_dir
    wanted = [(i, r) for i, r in enumerate(readers) if r.response_id and r.error is None]
    found = await _wait_for_times(
        directory, {r.response_id for _, r in wanted if r.response_id}, 3.0
    )
    offset = config.token_offset
    latencies = array("q")
    # a stream's deltas but its first and last MID_EDGE: its steady state (see the docstring)
    middle = array("q")
    samples_src: list[tuple[int, int, int, int]] = []
    missing = unmatched = 0
    # Up to ``samples`` deltas drawn uniformly (seeded) from all of them: a stride of every N-th
    # delta of each stream kept only each stream's first once N exceeded a stream's length.
    total = sum(r.deltas for _, r in wanted)
    chosen = set(random.Random(0).sample(range(total), min(max(0, config.samples), total)))
    position = 0
    for index, reader in wanted:
        yields = found.get(reader.response_id or "")
        if yields is None:
            missing += 1
            continue
        usable = len(yields) - offset
        unmatched += max(0, reader.deltas - usable)
        ordinal = 0
        inner = range(MID_EDGE, reader.deltas - MID_EDGE)
        for read_ns, upto in zip(reader.batch_ns, reader.batch_deltas, strict=True):
            stop = min(upto, usable)
            while ordinal < stop:
                y = yields[ordinal + offset]
                latencies.append(read_ns - y)
                if ordinal in inner:
                    middle.append(read_ns - y)
                if position in chosen:
                    samples_src.append((index, ordinal, read_ns, y))
                position += 1
                ordinal += 1
            ordinal = max(ordinal, upto)
    summary = _summary_ms(latencies)
    summary.update(
        {
            "streams_without_file": missing,
            "deltas_without_token_time": unmatched,
            "negative": sum(1 for v in latencies if v < 0),
        }
    )
    samples = [
        {"stream": i, "delta": o, "read_ns": r, "yield_ns": y, "ms": (r - y) / 1e6}
        for i, o, r, y in samples_src
    ]
    return {
        "latency_ms": summary,
        "latency_mid_ms": _summary_ms(middle),
        "latency_samples": samples,
    }


def arrival_offsets_ns(rate: float, count: int, seed: int) -> list[int]:
    """When each of ``count`` streams of an open loop starts, in ns after the first: a Poisson
    process of ``rate`` a second (independent exponential gaps), the same for the same seed."""
    if rate <= 0:
        raise ValueError(f"an arrival rate must be positive, got {rate!r}")
    draw = random.Random(seed).expovariate
    offsets, at = [], 0.0
    for _ in range(count):
        offsets.append(int(at * 1e9))
        at += draw(rate)
    return offsets


#: An open loop's free connection is not used again after this long (ns) without a stream.
_IDLE_LIMIT_NS = 2_000_000_000


async def _open_loop(
    config: LoadConfig,
    host: str,
    port: int,
    request: bytes,
    conns: list[_Connection],
    readers: list[StreamReader],
    t0: int,
    deadline: int | None,
) -> int:
    """Start ``config``'s streams at their arrival times (``arrival_offsets_ns`` after ``t0``)
    and read each to its end; returns how many started over a millisecond late (the load
    generator behind its schedule: then it, not the server, shaped the load)."""
    # free connections and when each was last released, the most recent last (taken first)
    idle = [(conn, t0) for conn in conns]
    tasks: list[asyncio.Task[None]] = []
    late = 0

    async def stream(reader: StreamReader) -> None:
        conn = None
        while idle and conn is None:
            conn, released = idle.pop()
            # a connection idle this long may be closing on the server's side (uvicorn's
            # keep-alive timeout is 5 s): a request sent as it closes would fail for nothing
            if conn.closed or monotonic_ns() - released > _IDLE_LIMIT_NS:
                if conn.transport is not None:
                    conn.transport.close()
                conn = None
        if conn is None:
            conn = await _connect(host, port)
            conns.append(conn)
        await conn.exchange(request, reader, config.timeout_s)
        if not conn.closed:
            idle.append((conn, monotonic_ns()))

    total = config.concurrency * config.streams_per_worker
    for offset in arrival_offsets_ns(config.arrival_rate, total, config.arrival_seed):
        at = t0 + offset
        if deadline is not None and at >= deadline:
            break
        wait = at - monotonic_ns()
        if wait > 0:
            await asyncio.sleep(wait / 1e9)
        elif wait < -1_000_000:
            late += 1
        reader = StreamReader(config.expected_events, config.token_marker, config.expected_tokens)
        readers.append(reader)
        tasks.append(asyncio.create_task(stream(reader)))
    await asyncio.gather(*tasks)
    return late


async def run_load(config: LoadConfig) -> dict:
    """Run the load described by ``config``; returns the JSON-serialisable report."""
    parts = urlsplit(config.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = config.request_bytes()
    conns = list(await asyncio.gather(*(_connect(host, port) for _ in range(config.concurrency))))
    readers: list[StreamReader] = []

    async def worker(slot: int) -> None:
        conn = conns[slot]
        if config.stagger_s > 0 and slot:
            await asyncio.sleep(slot * config.stagger_s / config.concurrency)
        for _ in range(config.streams_per_worker):
            if deadline is not None and monotonic_ns() >= deadline:
                return
            if conn.closed:
                conn = conns[slot] = await _connect(host, port)
            reader = StreamReader(
                config.expected_events, config.token_marker, config.expected_tokens
            )
            readers.append(reader)
            await conn.exchange(request, reader, config.timeout_s)

    deadline = None
    cpu0 = time.process_time()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = monotonic_ns()
    if config.max_seconds:
        deadline = t0 + int(config.max_seconds * 1e9)
    late: int | None = None
    if config.arrival_rate > 0:
        late = await _open_loop(config, host, port, request, conns, readers, t0, deadline)
    else:
        await asyncio.gather(*(worker(i) for i in range(config.concurrency)))
    t1 = monotonic_ns()
    cpu1 = time.process_time()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()

    wall_s = (t1 - t0) / 1e9
    cpu_s = cpu1 - cpu0
    deltas = sum(r.deltas for r in readers)
    events = sum(r.events for r in readers)
    errors = [f"stream {i}: {r.error}" for i, r in enumerate(readers) if r.error]
    # the streams whose latency counts: all of them, or those that started in the steady state
    start_from = t0 + int(config.measure_from_s * 1e9)
    measured = [r for r in readers if r.t_start >= start_from]
    ttft = array("q", (r.first_delta_ns - r.t_start for r in measured if r.first_delta_ns))
    report: dict = {
        "url": config.url,
        "concurrency": config.concurrency,
        "streams": len(readers),
        "streams_ok": len(readers) - len(errors),
        "error_count": len(errors),
        "errors": errors[:20],
        "tokens": deltas,
        "events": events,
        "delta_events": sum(r.delta_events for r in readers),
        "wall_s": wall_s,
        "tokens_per_s": deltas / wall_s if wall_s > 0 else 0.0,
        "events_per_s": events / wall_s if wall_s > 0 else 0.0,
        "per_stream_events": [r.events for r in readers],
        "reads": sum(len(r.batch_ns) for r in readers),
        "ttft_ms": _summary_ms(ttft),
        "loadgen_cpu_s": cpu_s,
        "loadgen_cpu_util": cpu_s / wall_s if wall_s > 0 else 0.0,
        "loadgen_cpu_us_per_event": cpu_s * 1e6 / events if events else None,
        "loadgen_ctx_switches": {
            "voluntary": ru1.ru_nvcsw - ru0.ru_nvcsw,
            "involuntary": ru1.ru_nivcsw - ru0.ru_nivcsw,
        },
        "t0_ns": t0,
        "t1_ns": t1,
        "measured_streams": len(measured),
    }
    if late is not None:
        report["arrival_rate"] = config.arrival_rate
        report["late_arrivals"] = late
        report["connections_opened"] = len(conns)
    if config.token_times_dir is not None:
        report.update(await _latency(config, measured))
    return report


def _run(coro: Coroutine[Any, Any, dict], loop: str) -> dict:
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise
        else:
            report = uvloop.run(coro)
            report["loadgen_loop"] = "uvloop"
            return report
    report = asyncio.run(coro)
    report["loadgen_loop"] = "asyncio"
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loadgen", description="Drive POST /v1/responses SSE streams."
    )
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8123/v1/responses")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--streams-per-worker", type=int, default=1)
    body = parser.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", help="the request's JSON body")
    body.add_argument("--body-file", type=Path)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop starting new streams after this long (those in flight finish)",
    )
    parser.add_argument("--expected-events", type=int, default=None)
    parser.add_argument(
        "--token-marker",
        default=None,
        help="count tokens as this text's occurrences in the delta frames (default: a token a delta)",
    )
    parser.add_argument("--expected-tokens", type=int, default=None, help="tokens per stream")
    parser.add_argument("--token-times-dir", type=Path, default=None)
    parser.add_argument("--token-offset", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per stream")
    parser.add_argument("--samples", type=int, default=1000, help="latency samples to report")
    parser.add_argument(
        "--stagger-seconds",
        type=float,
        default=0.0,
        help="spread the workers' first requests evenly over this many seconds (default 0: all at once)",
    )
    parser.add_argument(
        "--arrival-rate",
        type=float,
        default=0.0,
        help="open loop: start concurrency x streams-per-worker streams as a Poisson process of "
        "this many a second, whatever the server's pace (default 0: closed loop)",
    )
    parser.add_argument("--arrival-seed", type=int, default=0)
    parser.add_argument(
        "--measure-from-seconds",
        type=float,
        default=0.0,
        help="latency and time to first delta of the streams that start this long into the run only",
    )
    parser.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop of the load generator (auto: uvloop when installed)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (else stdout)")
    args = parser.parse_args(argv)
    if args.arrival_rate and args.stagger_seconds:
        parser.error("--stagger-seconds spreads a closed loop's workers; an open loop has none")
    if args.arrival_rate < 0:
        parser.error("--arrival-rate takes a positive rate, or 0 for a closed loop")
    raw = args.body.encode() if args.body is not None else args.body_file.read_bytes()
    json.loads(raw)  # fail early on a malformed template
    config = LoadConfig(
        url=args.url,
        body=raw,
        concurrency=args.concurrency,
        streams_per_worker=args.streams_per_worker,
        max_seconds=args.max_seconds,
        expected_events=args.expected_events,
        token_marker=None if args.token_marker is None else args.token_marker.encode(),
        expected_tokens=args.expected_tokens,
        token_times_dir=args.token_times_dir,
        token_offset=args.token_offset,
        timeout_s=args.timeout,
        samples=args.samples,
        stagger_s=args.stagger_seconds,
        arrival_rate=args.arrival_rate,
        arrival_seed=args.arrival_seed,
        measure_from_s=args.measure_from_seconds,
    )
    report = _run(run_load(config), args.loop)
    text = json.dumps(report)
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()

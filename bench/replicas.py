"""Three replicas behind HAProxy: the issue 15 figures.

``python -m bench.replicas [--streams 64] [--words 300] [--only kill,freeze,lag,rolling,cancel]``

Each scenario gets a PostgreSQL database of its own on the shared server, three
``responses-ledger serve`` processes (scripted engine, ``--words`` words at 15 ms a token) with
the default lease settings (lease 3 s, heartbeat 1 s, repair every 1 s, drain 30 s), and a
HAProxy in front (``tests/support/replicas.py``). Clients are the tests' ``ClientStream``: they
resume a cut stream through the balancer with ``starting_after`` the last seq they received.

- **kill**: ``--streams`` streams through HAProxy; ``kill -9`` the replica owning the most.
  Its responses completed by the survivors (%), how many were claimed more than once (a
  second ``takeover`` record: one survivor should claim each), the takeover time (kill -> the ``takeover``
  audit record's ``recorded_at``; and kill -> the first event a resuming client received after
  its cut), and over every client: duplicate and missing seqs.
- **freeze**: the same with ``SIGSTOP``: the frozen process still exists, so only its lease can
  expire; once every one of its responses has a takeover record (or 30 s), ``SIGKILL`` it.
- **lag**: ``--streams`` streamed POSTs on replica A directly and, as soon as each one's id
  is known, a follower of it on B (``GET ?stream=true`` from seq -1), all in one asyncio client
  on raw sockets (httpx in a thread a stream kept a core busy here and measured its own GIL
  hand-offs). Lag of seq s = when B's follower got it minus when A's creating client got it,
  counted once the follower is tailing (for the events A's client got after the follower had
  read the backlog), and again in the steady state, from 1 s after the last follower started;
  p50/p99 ms.
- **rolling**: a rolling restart (SIGTERM, wait for exit, start again, wait until HAProxy has it
  up; each of the three in turn) while ``--streams`` streams stay open through HAProxy: failed
  responses, streams that needed a resume, and the replicas' exit statuses.
- **cancel**: ``--streams`` background responses created on A, each cancelled on B; latency of
  the cancel call (p50/p99/max ms) and how many answered 200 with status ``cancelled``.

Targets (issue 15): 100 % of a dead replica's responses completed, 0 dups, 0 gaps, 0 failed in
a rolling restart, cancel from another replica p99 under 100 ms. A scenario that cannot run
says why in its row; the command exits 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from bench.stats import percentiles
from tests.support import haproxy
from tests.support.postgres import unavailable as pg_unavailable
from tests.support.replicas import (
    MODEL,
    ClientStream,
    Cluster,
    final_text,
    output_text,
    poll_until_terminal,
    seq_problems,
    slow_script,
)

NAMES = ("kill", "freeze", "lag", "rolling", "cancel")

Row = tuple[str, str]  # (figure, value)


def _ms(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    p50, p99, most = percentiles(values, 0.5, 0.99, 1)
    return f"p50 {p50 * 1e3:.0f} / p99 {p99 * 1e3:.0f} / max {most * 1e3:.0f} ms"


def _s(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"p50 {statistics.median(values):.2f} / max {max(values):.2f} s"


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _join(streams: Sequence[ClientStream], timeout_s: float) -> int:
    """Join them; how many are still open after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for stream in streams:
        stream.join(max(0.0, deadline - time.monotonic()))
    return sum(stream.is_alive() for stream in streams)


def _start(url: str, n: int) -> list[ClientStream]:
    streams = [ClientStream(url) for _ in range(n)]
    for stream in streams:
        stream.start()
    return streams


def _victim(cluster: Cluster, response_ids: list[str]) -> tuple[int, str, list[str]]:
    by_owner: dict[str, list[str]] = {}
    for rid, owner in cluster.owners(response_ids).items():
        by_owner.setdefault(str(owner), []).append(rid)
    owner, owned = max(by_owner.items(), key=lambda kv: len(kv[1]))
    return cluster.replica_ids()[owner], owner, owned


def _failed(streams: Sequence[ClientStream]) -> int:
    """Streams that did not end with ``response.completed`` (given up, still open, or another
    terminal event)."""
    return sum(
        s.failure is not None or s.terminal is None or s.terminal["type"] != "response.completed"
        for s in streams
    )


def _dups_gaps(streams: Sequence[ClientStream]) -> tuple[int, int]:
    dups = gaps = 0
    for stream in streams:
        d, g = seq_problems(stream.events)
        dups, gaps = dups + d, gaps + g
    return dups, gaps


def failure_scenario(workdir: Path, *, streams: int, words: int, freeze: bool) -> list[Row]:
    """kill -9 (or SIGSTOP, then SIGKILL after the takeover) the replica owning the most streams."""
    with Cluster(workdir, script=slow_script(words)) as cluster:
        clients = _start(cluster.url, streams)
        _wait(lambda: all(c.deltas >= 5 for c in clients), 120, "every stream to be generating")
        index, dead, owned = _victim(cluster, [str(c.response_id) for c in clients])
        process = cluster.process(index)
        struck_wall, struck = time.time(), time.monotonic()
        if freeze:
            process.signal(signal.SIGSTOP)
            with contextlib.suppress(TimeoutError):  # then the row shows what did happen
                _wait(
                    lambda: all(cluster.takeovers(rid) for rid in owned),
                    30,
                    "a takeover of every frozen response",
                )
            process.signal(signal.SIGKILL)
            process.proc.wait(timeout=30)
        else:
            process.kill()
        still_open = _join(clients, 180)
        records = {rid: cluster.takeovers(rid) for rid in owned}
        taken = [found[0] for found in records.values() if found]
        claimed_twice = sum(len(found) > 1 for found in records.values())
        takeover_s = [
            t["recorded_at"] - struck_wall for t in taken if t.get("from_replica") == dead
        ]
        first_event_s = []
        for client in clients:
            if client.response_id in owned and client.cuts:
                after = client.cuts[0].after_seq
                arrived = [
                    at
                    for event, at in zip(client.events, client.times, strict=True)
                    if event["sequence_number"] > after
                ]
                if arrived:
                    first_event_s.append(arrived[0] - struck)
        completed = 0
        for rid in owned:
            try:
                final = poll_until_terminal(cluster.url, rid, timeout_s=30)
            except AssertionError:
                continue
            completed += final["status"] == "completed" and output_text(final) == final_text(words)
        dups, gaps = _dups_gaps(clients)
        failed = _failed(clients)
        verb = "SIGSTOP" if freeze else "kill -9"
        return [
            (
                f"{verb}: its responses completed by the survivors",
                f"{completed}/{len(owned)} ({100 * completed / max(1, len(owned)):.0f} %)",
            ),
            (
                f"{verb}: takeover time (audit record)",
                _s(takeover_s) + f" ({len(takeover_s)} records)",
            ),
            (f"{verb}: responses taken over more than once", f"{claimed_twice}/{len(owned)}"),
            (f"{verb}: takeover time (first continued event)", _s(first_event_s)),
            (
                f"{verb}: clients resumed / not completed / still open",
                f"{sum(bool(c.cuts) for c in clients)} / {failed} / {still_open} of {len(clients)}",
            ),
            (f"{verb}: duplicate / missing seqs", f"{dups} / {gaps}"),
        ]


_SEQ = re.compile(rb'"sequence_number":(\d+)[,}]')
_ID = re.compile(rb'"id":"(resp_[0-9a-f]+)"')
_ENDS = (b"event: response.completed", b"event: response.failed", b"event: response.incomplete")


class _Tap(asyncio.Protocol):
    """One raw HTTP/1.1 SSE stream: when each ``sequence_number`` arrived (loop time), and the
    response id. No HTTP library: at 128 streams on 2 cores, httpx's parsing alone kept a core
    busy and its queueing showed up as lag."""

    def __init__(self, request: bytes, on_id: Callable[[str], None] | None = None) -> None:
        self.request = request
        self.on_id = on_id
        self.times: dict[int, float] = {}
        self.ended = False
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf = b""
        self._id_seen = on_id is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = asyncio.get_running_loop().time()
        buf = self._buf + data
        if not self._id_seen:
            found = _ID.search(buf)
            if found is not None and self.on_id is not None:
                self._id_seen = True
                self.on_id(found.group(1).decode())
        last = 0
        for match in _SEQ.finditer(buf):
            self.times.setdefault(int(match.group(1)), now)
            last = match.end()
        if any(end in buf for end in _ENDS):
            self.ended = True
        self._buf = buf[max(last, len(buf) - 64) :]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


async def _open(
    url: str, method: str, path: str, body: bytes, on_id: Callable[[str], None] | None = None
) -> _Tap:
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
        f"Connection: close\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    _, tap = await loop.create_connection(lambda: _Tap(head + body, on_id), host, int(port))
    return tap


async def _async_lag(a_url: str, b_url: str, streams: int) -> tuple[list[float], list[float], int]:
    """The lag measured by one asyncio client on raw sockets: ``streams`` streamed POSTs on A;
    as soon as each one's id is known, a follower of it on B from seq -1. Returns the lags (s) of
    the events A's client got after the follower had caught up; the same from one second after
    the last follower started (every follower tailing, its ``LISTEN`` in effect: the steady
    state); and how many followers reached the terminal event."""
    loop = asyncio.get_running_loop()
    body = json.dumps({"model": MODEL, "input": "go", "stream": True}).encode()
    pairs: list[tuple[_Tap, _Tap, float]] = []
    waits: list[asyncio.Future[None]] = []

    def follow(creator: _Tap) -> Callable[[str], None]:
        def on_id(rid: str) -> None:
            async def start() -> None:
                started = loop.time()
                follower = await _open(b_url, "GET", f"/v1/responses/{rid}?stream=true", b"")
                pairs.append((creator, follower, started))
                waits.append(follower.finished)

            waits.append(asyncio.ensure_future(start()))

        return on_id

    creators = []
    for _ in range(streams):
        holder: list[_Tap] = []
        tap = await _open(
            a_url, "POST", "/v1/responses", body, lambda rid, h=holder: follow(h[0])(rid)
        )
        holder.append(tap)
        creators.append(tap)
    await asyncio.gather(*(c.finished for c in creators))
    while not all(w.done() for w in waits):
        await asyncio.gather(*waits)
    lags: list[float] = []
    steady: list[float] = []
    settled = max(started for _, _, started in pairs) + 1.0
    for creator, follower, started in pairs:
        backlog = [seq for seq, at in creator.times.items() if at <= started]
        tailing_from = follower.times.get(max(backlog), started) if backlog else started
        for seq, at in creator.times.items():
            if at > tailing_from and seq in follower.times:
                lags.append(follower.times[seq] - at)
                if at > settled:
                    steady.append(follower.times[seq] - at)
    return lags, steady, sum(f.ended for _, f, _ in pairs)


def lag_scenario(workdir: Path, *, streams: int, words: int) -> list[Row]:
    with Cluster(workdir, script=slow_script(words)) as cluster:
        a, b = cluster.process(0), cluster.process(1)
        lags, steady, ended = asyncio.run(_async_lag(a.base_url, b.base_url, streams))
    return [
        (
            "follower lag on another replica (one raw asyncio client)",
            _ms(lags) + f" ({len(lags)} events)",
        ),
        (
            "  the same, from 1 s after the last follower started",
            _ms(steady) + f" ({len(steady)} events)",
        ),
        ("followers that reached the terminal event", f"{ended}/{streams}"),
    ]


class _Load(threading.Thread):
    """Keeps ``width`` streams open through the balancer until stopped."""

    def __init__(self, url: str, width: int) -> None:
        super().__init__(daemon=True)
        self.url, self.width = url, width
        self.streams: list[ClientStream] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            missing = self.width - sum(s.is_alive() for s in self.streams)
            self.streams.extend(_start(self.url, missing))
            time.sleep(0.1)


def rolling_scenario(workdir: Path, *, streams: int, words: int) -> list[Row]:
    with Cluster(workdir, script=slow_script(words)) as cluster:
        load = _Load(cluster.url, streams)
        load.start()
        _wait(
            lambda: sum(s.deltas >= 5 for s in load.streams) >= streams,
            120,
            "the load to be streaming",
        )
        started = time.monotonic()
        exits = []
        for index in range(3):
            exits.append(cluster.stop_replica(index, timeout_s=120))
            cluster.start_replica(index)
        took = time.monotonic() - started
        load.stopping.set()
        load.join(10)
        still_open = _join(load.streams, 180)
        failed = _failed(load.streams)
        gave_up = sum(s.failure is not None for s in load.streams)
        dups, gaps = _dups_gaps(load.streams)
        return [
            (
                "rolling restart: failed responses",
                f"{failed} of {len(load.streams)} (clients gave up: {gave_up}, still open: {still_open})",
            ),
            (
                "rolling restart: streams that needed a resume",
                str(sum(bool(s.cuts) for s in load.streams)),
            ),
            ("rolling restart: duplicate / missing seqs", f"{dups} / {gaps}"),
            ("rolling restart: exit statuses, time", f"{exits}, {took:.1f} s"),
        ]


def cancel_scenario(workdir: Path, *, streams: int, words: int) -> list[Row]:
    with Cluster(workdir, script=slow_script(words)) as cluster:
        a, b = cluster.process(0), cluster.process(1)
        ids = []
        with httpx.Client(timeout=30) as client:
            for _ in range(streams):
                answer = client.post(
                    a.base_url + "/v1/responses",
                    json={"model": MODEL, "input": "go", "background": True},
                )
                answer.raise_for_status()
                ids.append(str(answer.json()["id"]))
            _wait(
                lambda: all(
                    client.get(f"{a.base_url}/v1/responses/{rid}").json()["status"] == "in_progress"
                    for rid in ids
                ),
                60,
                "every response to be in progress",
            )
            latencies, cancelled = [], 0
            for rid in ids:
                began = time.perf_counter()
                answer = client.post(f"{b.base_url}/v1/responses/{rid}/cancel")
                latencies.append(time.perf_counter() - began)
                cancelled += (
                    answer.status_code == 200 and answer.json().get("status") == "cancelled"
                )
        return [
            ("cancel on another replica: latency", _ms(latencies)),
            ("cancel on another replica: answered cancelled", f"{cancelled}/{len(ids)}"),
        ]


def _run(name: str, workdir: Path, streams: int, words: int) -> list[Row]:
    if name in ("kill", "freeze"):
        return failure_scenario(workdir, streams=streams, words=words, freeze=name == "freeze")
    if name == "lag":
        return lag_scenario(workdir, streams=streams, words=min(words, 120))
    if name == "rolling":
        return rolling_scenario(workdir, streams=streams, words=min(words, 120))
    return cancel_scenario(workdir, streams=streams, words=words)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replicas", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--streams", type=int, default=64, help="streams per scenario (default 64)")
    parser.add_argument(
        "--words", type=int, default=300, help="words per completion, 15 ms a token (default 300)"
    )
    parser.add_argument(
        "--only", default=",".join(NAMES), help=f"comma-separated subset of {','.join(NAMES)}"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print a failed scenario's traceback"
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        parser.error(f"unknown scenarios: {unknown}")
    missing = haproxy.unavailable() or asyncio.run(pg_unavailable())
    rows: list[Row] = []
    for name in chosen:
        if missing is not None:
            rows.append((name, f"not run: {missing}"))
            continue
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"bench-replicas-{name}-") as tmp:
            try:
                rows += _run(name, Path(tmp), args.streams, args.words)
            except Exception as exc:
                rows.append((name, f"did not finish: {type(exc).__name__}: {str(exc)[:300]}"))
                if args.verbose:
                    traceback.print_exc()
        print(f"# {name}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    width = max(len(figure) for figure, _ in rows)
    print(
        f"replicas: 3 behind HAProxy, {args.streams} streams, {args.words} words at 15 ms a token"
    )
    for figure, value in rows:
        print(f"{figure.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

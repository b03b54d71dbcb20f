"""What the metrics cost: per streamed token (target <= 0.5 us), and a scrape (target <= 10 ms
with 100,000 responses stored).

``python -m bench.metrics [--tokens 200000] [--reps 7] [--responses 100000] [--scrapes 200]``

- **per token**, metrics on vs off side by side: the live path of ``app.live.LogWriter`` (a
  delta event made into its stored record and SSE frame, handed to a store, published to a
  subscriber after its "commit", read by the stream) with **one token per commit**, the worst
  case (an engine pacing tokens slower than a commit; a faster one puts many tokens in a commit
  and the metrics cost is divided among them). The store is a stand-in that settles each
  write on the next loop turn and, with metrics on, makes the real store's per-commit
  observation (a clock read and ``Metrics.observe_commit``). Interleaved runs, medians; the
  difference on minus off is what the metrics cost a token; on a busy machine it is noisy, so
  the metrics' work per commit is also timed alone (the best of three). Also printed: one observation of
  ``app.metrics.Histogram`` and of prometheus_client's ``Histogram``, for reference.
- **scrape**: a SQLite database with ``--responses`` finished responses, a server process
  (``responses-ledger serve``, the echo engine) on it, a few hundred responses through HTTP (so
  every family has samples), then ``--scrapes`` ``GET /metrics`` from this process over a real
  socket: median and p99 in ms, and the body's size. Nothing is read from the database for a
  scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import prometheus_client

from app.live import Batch, LogWriter, Run
from app.metrics import Histogram, Metrics
from bench.reads import _store_response
from bench.stats import percentile
from domain.events import OutputTextDelta
from persistence.records import StoredEvent
from persistence.sql import open_store
from persistence.store import Done


async def _per_token_run(tokens: int, metrics: Metrics | None) -> float:
    """Seconds per token through the live path, one token per commit."""
    loop = asyncio.get_running_loop()
    run = Run(
        id="resp_bench",
        store=True,
        background=False,
        engine_request_id="r",
        started=time.monotonic(),
    )
    queue = run.subscribe()
    if metrics is not None:  # what Metrics.attach does for a SqlStore
        metrics.stream.commit_clock = True
        observe_commit = metrics.commit_observer()

    def submit(
        response_id: str,
        events: Sequence[StoredEvent],
        seq: int,
        done: Done,
        token_ids: Sequence[int],
    ) -> None:
        first_at = loop.time()  # GroupCommit reads it for every batch, metrics or not

        def committed() -> None:
            if metrics is not None:  # what SqlStore._write adds per transaction
                observe_commit(len(events), first_at, time.monotonic())
            done(None)

        loop.call_soon(committed)

    writer = LogWriter(run, submit, timing=metrics.stream if metrics is not None else None)
    start = time.perf_counter()
    for seq in range(tokens):
        writer.push([OutputTextDelta(seq, "msg_bench", 0, 0, " word")], (seq,))
        await queue.get()
    return (time.perf_counter() - start) / tokens


def _hooks_cost(n: int = 1_000_000) -> float:
    """Seconds per commit of what metrics on adds to one, timed alone (less noisy than the
    difference of two whole runs on a busy machine): the store's clock read and commit
    observation, and the writer's stream observation (its time is the commit's)."""
    metrics = Metrics()
    run = Run(
        id="resp_bench",
        store=True,
        background=False,
        engine_request_id="r",
        started=time.monotonic(),
    )
    metrics.stream.commit_clock = True
    observe_commit, clock = metrics.commit_observer(), time.monotonic
    writer = LogWriter(run, lambda *args: None, timing=metrics.stream)
    batch = Batch(0, (), False)
    first_at = clock()
    start = time.perf_counter()
    for _ in range(n):  # what a commit adds, metrics on: the store's part, then the writer's
        observe_commit(1, first_at, clock())
        writer._durable(batch, True, None)
    with_metrics = (time.perf_counter() - start) / n
    writer = LogWriter(run, lambda *args: None, timing=None)
    start = time.perf_counter()
    for _ in range(n):
        writer._durable(batch, True, None)
    return with_metrics - (time.perf_counter() - start) / n


def _call_cost(n: int = 1_000_000) -> float:
    """Seconds per call of an empty Python function here and now: how fast this machine is at
    the moment (the figures above scale with it on a machine shared with other work)."""

    def empty() -> None:
        return None

    start = time.perf_counter()
    for _ in range(n):
        empty()
    return (time.perf_counter() - start) / n


def _observe_cost(n: int = 1_000_000) -> tuple[float, float]:
    ours = Histogram("bench_seconds", "bench", (0.001, 0.01, 0.1, 1.0, 10.0))
    start = time.perf_counter()
    for _ in range(n):
        ours.observe(0.003)
    ours_s = (time.perf_counter() - start) / n
    registry = prometheus_client.CollectorRegistry()
    theirs = prometheus_client.Histogram("bench_seconds", "bench", registry=registry)
    start = time.perf_counter()
    for _ in range(n):
        theirs.observe(0.003)
    return ours_s, (time.perf_counter() - start) / n


async def per_token(tokens: int, reps: int) -> dict[str, float]:
    await _per_token_run(tokens // 10, None)  # warm up
    off: list[float] = []
    on: list[float] = []
    for _ in range(reps):
        off.append(await _per_token_run(tokens, None))
        on.append(await _per_token_run(tokens, Metrics()))
    ours, theirs = _observe_cost()
    return {
        "hooks_us": min(_hooks_cost() for _ in range(3)) * 1e6,
        "call_us": min(_call_cost() for _ in range(3)) * 1e6,
        "off_us": statistics.median(off) * 1e6,
        "on_us": statistics.median(on) * 1e6,
        "cost_us": (statistics.median(on) - statistics.median(off)) * 1e6,
        "pairs_cost_us_min": min(b - a for a, b in zip(off, on, strict=True)) * 1e6,
        "pairs_cost_us_max": max(b - a for a, b in zip(off, on, strict=True)) * 1e6,
        "observe_us": ours * 1e6,
        "prometheus_client_observe_us": theirs * 1e6,
    }


async def _fill(url: str, responses: int) -> None:
    store = await open_store(url)
    try:
        batch = []
        for i in range(responses):
            batch.append(_store_response(store, None, 3, f"other {i}"))
            if len(batch) == 512:
                await asyncio.gather(*batch)
                batch = []
        await asyncio.gather(*batch)
    finally:
        await store.close()


async def scrape(responses: int, scrapes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'responses.db'}"
        started = time.perf_counter()
        await _fill(url, responses)
        fill_s = time.perf_counter() - started
        port = _free_port()
        env = {**os.environ, "DATABASE_URL": url, "RESPONSES_LEDGER_LOG_LEVEL": "warning"}
        argv = [sys.executable, "-m", "app.cli", "serve", "--engine", "echo", "--port", str(port)]
        server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if (await http.get("/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the server did not start: {server.stderr and server.stderr.read()!r}"
                        )
                    await asyncio.sleep(0.1)
                for i in range(300):  # every family gets samples
                    body: dict[str, Any] = {
                        "model": "gpt-oss-echo",
                        "input": f"hi {i}",
                        "stream": i % 2 == 0,
                    }
                    (await http.post("/v1/responses", json=body)).raise_for_status()
                health: list[float] = []
                for _ in range(scrapes):  # the same client and server, a route that does nothing
                    t0 = time.perf_counter()
                    (await http.get("/health/live")).raise_for_status()
                    health.append((time.perf_counter() - t0) * 1000)
                times: list[float] = []
                size = 0
                for _ in range(scrapes):
                    t0 = time.perf_counter()
                    r = await http.get("/metrics")
                    times.append((time.perf_counter() - t0) * 1000)
                    r.raise_for_status()
                    size = len(r.content)
        finally:
            server.terminate()
            server.wait(timeout=30)
    times.sort()
    return {
        "stored": responses,
        "fill_s": fill_s,
        "scrape_p50_ms": statistics.median(times),
        "scrape_p99_ms": percentile(times, 0.99),
        "bytes": size,
        "health_p50_ms": statistics.median(health),
    }


def _render_ms(runs: int = 200) -> float:
    """``Metrics.scrape`` alone (an app's registry and the global one), in this process."""
    metrics = Metrics()
    metrics.scrape()
    t0 = time.perf_counter()
    for _ in range(runs):
        metrics.scrape()
    return (time.perf_counter() - t0) * 1000 / runs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--responses", type=int, default=100_000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--skip-scrape", action="store_true")
    args = parser.parse_args()
    cost = await per_token(args.tokens, args.reps)
    print(
        f"per token, one token per commit: off {cost['off_us']:.2f} us, on {cost['on_us']:.2f} us: "
        f"metrics cost {cost['cost_us']:+.3f} us per token (pairs {cost['pairs_cost_us_min']:+.3f} "
        f"to {cost['pairs_cost_us_max']:+.3f}); the metrics' work per commit timed alone: "
        f"{cost['hooks_us']:.3f} us; one observation: {cost['observe_us']:.3f} us "
        f"(prometheus_client's Histogram: {cost['prometheus_client_observe_us']:.3f} us); "
        f"an empty function call: {cost['call_us']:.3f} us"
    )
    if not args.skip_scrape:
        s = await scrape(args.responses, args.scrapes)
        print(
            f"scrape with {s['stored']:,} responses stored (filled in {s['fill_s']:.0f} s): "
            f"p50 {s['scrape_p50_ms']:.2f} ms, p99 {s['scrape_p99_ms']:.2f} ms over HTTP "
            f"(a server process, the client in this one; GET /health/live p50 {s['health_p50_ms']:.2f} ms); "
            f"{s['bytes']:,} bytes; rendering alone "
            f"(no samples) {_render_ms():.2f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())

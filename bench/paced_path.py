"""The ledger's own per-token work under a paced engine, in one process, without HTTP.

Usage: ``python -m bench.paced_path [--backend sqlite|postgres|both] [--streams 256]
[--tokens 200] [--step-ms 10] [--reps 3] [--calls]``.

``--streams`` responses are generated together, one token each per step of ``--step-ms``, as an
engine's step loop hands them out: each token goes through the Harmony decoder, the response
builder and the state machine, ``LogWriter.push`` (stored event and SSE frame), the group commit
into a real store, and the publish that writes the committed frames to the stream's (attached)
subscription, whose writer here only counts and times the bytes. What this leaves out, the HTTP
request, the engine and the socket write, is the same for the naive peer (``bench.naive``), so
this is the part of a paced token's CPU that is the ledger's alone.

Each response ends with its output's done events, not with a terminal one, unless
``--complete``: then with ``response.completed`` too, so each log's last commit (the row's
status, what an ending costs the store) is counted; every stream ends in the same commit.

Printed: CPU (user + system, every thread of the process) per token, the commits and events
per commit, and the lag of each written batch: from the step whose token made its first event
to the write of its frames, after their commit (p50 / p99). Medians over ``--reps``.
Deterministic enough to compare two trees side by side (``git stash``, or two work trees), which
the HTTP benchmark's VM noise often is not.

``--calls``: one more run of each backend under ``cProfile``, which prints the Python function
calls a token (those of Python code, and all, C functions included) from the first token to the
last commit: a count, which moves only with how the tokens fell into commits (a few per cent
between runs of one tree), where CPU time on a shared VM moves by a fifth. Fewer calls is not
less time by itself, but on this path it nearly always is (each costs 0.1-0.5 µs here). Only
the event loop's thread is counted: on SQLite a commit's plan and statements run in its writer
thread (``persistence.sqlite_writer``) and are left out, on PostgreSQL they are in.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import itertools
import json
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.encoding import load_encoding
from app.leases import new_replica
from app.live import LogWriter, Run
from app.main import tune_gc
from app.settings import SERVE_GC_THRESHOLD
from bench.stats import percentiles
from domain.builder import ResponseBuilder, Usage
from domain.decoder import HarmonyDecoder
from domain.events import Event
from persistence.records import NewResponse
from persistence.sql import open_store
from tests.support.postgres import fresh_database


def _builder(response_id: str, counter: itertools.count[int]) -> ResponseBuilder:
    skeleton = {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "model": "gpt-oss-scripted",
        "status": "in_progress",
        "output": [],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    return ResponseBuilder(skeleton, new_id=lambda prefix: f"{prefix}_{next(counter):032x}")


async def _one_run(
    url: str,
    streams: int,
    tokens: int,
    step_s: float,
    profile: cProfile.Profile | None = None,
    *,
    complete: bool = False,
) -> dict[str, float]:
    encoding = load_encoding()
    text = " word" * tokens  # one o200k token a word: one delta a token
    completion = encoding.encode(
        f"<|channel|>final<|message|>{text}<|return|>", allowed_special="all"
    )
    store = await open_store(url)
    # a replica's lease, as a server holds one: on PostgreSQL its commits fence their logs by
    # its row (``SqlStore._fence``)
    replica = new_replica()
    store.lease(replica, 60.0)
    await store.probe()
    counter = itertools.count()
    written = [0]
    lags: list[float] = []

    def sink(started: collections.deque[float]) -> Callable[[bytes], bool]:
        """A stream's writer: each batch written is the oldest one submitted (one commit in
        flight a response, batches published in order), whose first events were pushed at the
        step ``started`` holds for it."""

        def write(data: bytes) -> bool:
            written[0] += len(data)
            lags.append(time.monotonic() - started.popleft())
            return True

        return write

    try:
        runs = []
        for _ in range(streams):
            rid = f"resp_{secrets.token_hex(16)}"
            run = Run(id=rid, store=True, background=False, engine_request_id=rid)
            await store.create_response(
                NewResponse(
                    rid,
                    "gpt-oss-scripted",
                    int(time.time()),
                    None,
                    False,
                    {"input": "hi"},
                    [],
                    owner=replica.id,
                )
            )
            builder = _builder(rid, counter)
            # the log's first events are written with the response's row in production; here the
            # row is there already and the writer starts at seq 0 with response.created
            writer = LogWriter(run, store.submit_then)
            builder.created()
            writer.push(builder.take())
            builder.in_progress()
            writer.push(builder.take())
            runs.append(
                (run, builder, writer, HarmonyDecoder(encoding, builder), collections.deque())
            )
        for run, _, writer, _, started in runs:
            await writer.drain()
            run.subscribe().attach(sink(started))  # (the opening events are out already)

        def push(
            writer: LogWriter,
            events: list[Event],
            started: collections.deque[float],
            at: float,
            token: int | None = None,
        ) -> None:
            if events and not writer.queued:  # these events begin the next batch
                started.append(at)
            writer.push(events, () if token is None else (token,))

        tune_gc(SERVE_GC_THRESHOLD)  # as ``serve`` does once it has started
        if profile is not None:
            profile.enable()
        cpu0, wall0 = time.process_time(), time.monotonic()
        stats0 = store.stats
        pushed = 0
        for token in completion:
            step = time.monotonic()
            for _, builder, writer, decoder, started in runs:
                decoder.feed((token,))
                push(writer, builder.take(), started, step, token)
                pushed += 1
            await asyncio.sleep(step_s)
        step = time.monotonic()
        for _, builder, writer, decoder, started in runs:
            decoder.finish(truncated=False)
            if complete:  # the terminal event: the log's last commit, its row's status
                builder.finish("completed", usage=Usage(), completed_at=int(time.time()))
            push(writer, builder.take(), started, step)
        for _, _, writer, _, _ in runs:
            await writer.drain()
        if profile is not None:
            profile.disable()
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
        stats = store.stats
        commits = stats.transactions - stats0.transactions
        events = stats.events - stats0.events
    finally:
        await store.close()
    lag_p50, lag_p99 = percentiles(lags, 0.5, 0.99)
    return {
        "us_per_token": cpu / pushed * 1e6,
        "cpu": cpu / wall,
        "commits": commits,
        "events_per_commit": events / max(commits, 1),
        "lag_p50_ms": lag_p50 * 1000,
        "lag_p99_ms": lag_p99 * 1000,
        "bytes": written[0],
        "tokens": pushed,
        "events": events,
    }


async def _run_on(
    backend: str,
    streams: int,
    tokens: int,
    step_s: float,
    profile: cProfile.Profile | None = None,
    *,
    complete: bool = False,
) -> dict[str, float]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite+aiosqlite:///{Path(tmp) / 'ledger.db'}"
            return await _one_run(url, streams, tokens, step_s, profile, complete=complete)
    async with fresh_database("bench_paced") as url:
        return await _one_run(url, streams, tokens, step_s, profile, complete=complete)


async def _calls(
    backend: str, streams: int, tokens: int, step_s: float, *, complete: bool
) -> dict[str, float]:
    """Function calls a token in one run under ``cProfile`` (see the module docstring)."""
    profile = cProfile.Profile()
    result = await _run_on(backend, streams, tokens, step_s, profile, complete=complete)
    counts = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    pushed = result["tokens"]
    # a key's file is "~" for a C function (a builtin, a method of a C type)
    python = sum(row[1] for (file, _, _), row in counts.items() if file != "~")
    every = sum(row[1] for row in counts.values())
    return {"python_calls_per_token": python / pushed, "calls_per_token": every / pushed}


async def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.paced_path", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object per backend")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="also count the function calls a token, in one more run under cProfile",
    )
    parser.add_argument(
        "--complete",
        action="store_true",
        help="end each response with its terminal event (response.completed), so each log's "
        "last commit and its row's status change are counted too (here every stream ends in "
        "the same commit, as in a wave)",
    )
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    print(
        f"{args.streams} streams x {args.tokens} tokens, a step every {args.step_ms:g} ms, median of {args.reps}"
        + (", each response completed" if args.complete else "")
    )
    print("| store | us/token | CPU | commits | events/commit | lag p50 ms | lag p99 ms |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    calls: dict[str, dict[str, float]] = {}
    for backend in backends:
        results = [
            await _run_on(
                backend, args.streams, args.tokens, args.step_ms / 1000, complete=args.complete
            )
            for _ in range(args.reps)
        ]
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        if args.calls:
            calls[backend] = await _calls(
                backend, args.streams, args.tokens, args.step_ms / 1000, complete=args.complete
            )
        if args.json:
            print(
                json.dumps({"backend": backend, **med, **calls.get(backend, {}), "runs": results})
            )
        print(
            f"| {backend} | {med['us_per_token']:.2f} | {med['cpu']:.2f} | {med['commits']:.0f} | "
            f"{med['events_per_commit']:.1f} | {med['lag_p50_ms']:.2f} | {med['lag_p99_ms']:.2f} |"
        )
    if calls:
        print()
        print("| store | Python calls/token | all calls/token |")
        print("|---|--:|--:|")
        for backend, counted in calls.items():
            print(
                f"| {backend} | {counted['python_calls_per_token']:.1f} | {counted['calls_per_token']:.1f} |"
            )
    return 0


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:  # the server runs on uvloop where it is installed
        sys.exit(asyncio.run(main()))
    sys.exit(uvloop.run(main()))

"""How fast the SQL store appends streamed events, and how much room each event takes.

    python bench/store_append.py                      # SQLite (FULL and NORMAL) and PostgreSQL
    python bench/store_append.py --backend sqlite --writers 64 --events 300 --window-ms 0

Each of ``--writers`` concurrent writers owns one response and appends ``--events`` small
``response.output_text.delta`` events (~150 bytes of JSON, pre-serialised as the service does)
through ``submit``, one to three at a time. Two ways:

- ``wait`` (default): each writer waits for a submission to be durable before it submits the
  next, so each has one in flight: the latency-bound case.
- ``pipelined``: writers do not wait (they keep the futures and yield to the loop after each
  submit): what the store can absorb when producers outpace commits.

Reported: appended events per second,
commit transactions and events per transaction (group commit at work), append latency
(submit to durable), and bytes stored per event (table and its key; for PostgreSQL including
TOAST and indexes), measured on the database after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import percentile
from persistence.records import NewResponse, StoredEvent
from persistence.sql import SqlStore, open_store


@dataclass(frozen=True)
class Result:
    label: str
    events: int
    seconds: float
    transactions: int
    latencies: list[float]
    bytes_per_event: float
    payload_bytes: float

    def report(self) -> str:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1000
        p99 = percentile(lat, 0.99) * 1000
        return (
            f"{self.label:<28} {self.events / self.seconds:>10,.0f} events/s  "
            f"{self.events / self.transactions:>6.1f} events/txn  "
            f"p50 {p50:5.1f} ms  p99 {p99:6.1f} ms  "
            f"{self.bytes_per_event:6.0f} B/event stored ({self.payload_bytes:.0f} B JSON payload)"
        )


def _delta_json(item_id: str, n: int) -> str:
    return json.dumps(
        {
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": f" token{n % 1000}",
            "logprobs": [],
            "obfuscation": secrets.token_hex(8),
        },
        separators=(",", ":"),
    )


async def _run(
    store: SqlStore, *, writers: int, events: int, pipelined: bool
) -> tuple[float, list[float], int]:
    rids = []
    for _ in range(writers):
        rid = f"resp_{secrets.token_hex(24)}"
        await store.create_response(
            NewResponse(rid, "gpt-oss-20b", int(time.time()), None, False, {"input": "hi"}, [])
        )
        rids.append(rid)
    latencies: list[float] = []
    in_flight: list[asyncio.Future[None]] = []

    async def writer(rid: str) -> None:
        item_id = f"msg_{secrets.token_hex(24)}"
        seq = 0
        while seq < events:
            size = min(1 + seq % 3, events - seq)
            batch = []
            for offset in range(size):
                text = _delta_json(item_id, seq + offset)
                batch.append(
                    StoredEvent(seq + offset, "response.output_text.delta", json.loads(text), text)
                )
            started = time.perf_counter()
            future = store.submit(rid, batch, seq)
            seq += size
            if pipelined:
                future.add_done_callback(
                    lambda _, t=started: latencies.append(time.perf_counter() - t)
                )
                in_flight.append(future)
                await asyncio.sleep(0)
            else:
                await future
                latencies.append(time.perf_counter() - started)

    before = store.stats.transactions
    started = time.perf_counter()
    await asyncio.gather(*(writer(rid) for rid in rids))
    await asyncio.gather(*in_flight)
    elapsed = time.perf_counter() - started
    return elapsed, latencies, store.stats.transactions - before


async def bench_sqlite(
    synchronous: str, *, writers: int, events: int, window_ms: float, pipelined: bool
) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        url = f"sqlite+aiosqlite:///{path}"
        store = await open_store(
            url,
            commit_window_ms=window_ms,
            sqlite_synchronous=synchronous,  # type: ignore[arg-type]
        )
        try:
            elapsed, latencies, transactions = await _run(
                store, writers=writers, events=events, pipelined=pipelined
            )
        finally:
            await store.close()
        connection = sqlite3.connect(path)
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            (stored,) = connection.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name = 'response_events'"
            ).fetchone()
            count, payload = connection.execute(
                "SELECT count(*), avg(length(CAST(payload AS BLOB))) FROM response_events"
            ).fetchone()
        finally:
            connection.close()
    return Result(
        f"SQLite synchronous={synchronous}",
        writers * events,
        elapsed,
        transactions,
        latencies,
        stored / count,
        payload,
    )


async def bench_postgres(
    admin_dsn: str, *, writers: int, events: int, window_ms: float, pipelined: bool
) -> Result:
    name = f"ledger_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    base = admin_dsn.rsplit("/", 1)[0].split("://", 1)[1]
    try:
        store = await open_store(f"postgresql+asyncpg://{base}/{name}", commit_window_ms=window_ms)
        try:
            elapsed, latencies, transactions = await _run(
                store, writers=writers, events=events, pipelined=pipelined
            )
        finally:
            await store.close()
        db = await asyncpg.connect(f"postgresql://{base}/{name}")
        try:
            await db.execute("VACUUM ANALYZE response_events")
            stored = await db.fetchval("SELECT pg_total_relation_size('response_events')")
            count, payload = await db.fetchrow(
                "SELECT count(*), avg(octet_length(payload::text)) FROM response_events"
            )
        finally:
            await db.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return Result(
        "PostgreSQL",
        writers * events,
        elapsed,
        transactions,
        latencies,
        stored / count,
        float(payload),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL", "both"], default="both")
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--events", type=int, default=300, help="events per writer")
    parser.add_argument(
        "--window-ms", type=float, default=0.0, help="group-commit window (the server default: 0)"
    )
    parser.add_argument("--mode", choices=["wait", "pipelined", "both"], default="both")
    parser.add_argument("--postgres-admin-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    for mode in ["wait", "pipelined"] if args.mode == "both" else [args.mode]:
        pipelined = mode == "pipelined"
        print(
            f"{args.writers} writers x {args.events} events, 1-3 events per submit, "
            f"commit window {args.window_ms} ms, {mode}"
        )
        if args.backend in ("sqlite", "both"):
            syncs = ["FULL", "NORMAL"] if args.synchronous == "both" else [args.synchronous]
            for synchronous in syncs:
                result = await bench_sqlite(
                    synchronous,
                    writers=args.writers,
                    events=args.events,
                    window_ms=args.window_ms,
                    pipelined=pipelined,
                )
                print(result.report(), flush=True)
        if args.backend in ("postgres", "both"):
            result = await bench_postgres(
                args.postgres_admin_dsn,
                writers=args.writers,
                events=args.events,
                window_ms=args.window_ms,
                pipelined=pipelined,
            )
            print(result.report(), flush=True)


if __name__ == "__main__":
    asyncio.run(main())

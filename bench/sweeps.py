"""What a replica's periodic queries cost once the database holds many finished responses.

Usage: ``python -m bench.sweeps [--rows 1000000] [--backend sqlite|postgres|both] [--reps 5]``.

Every replica asks the database, every heartbeat (1 s), which responses are unfinished and
owned by no live replica (the orphan sweep, ``app.repair``), and, every few seconds or when its
doorbell rings, which of its own responses someone asked to cancel (``app.remote_cancel``).
Both look for the few unfinished rows among all the rows ever stored, so their cost must follow
the unfinished rows, not the table. This script fills a migrated database with ``--rows``
responses (one in 10,000 unfinished, a third owned by one replica), runs ``ANALYZE`` (what an
operator's maintenance, or PostgreSQL's autovacuum, does), and times the store's own calls
(``SqlStore.unfinished``, ``SqlStore.cancel_requests``) as the server makes them: the median
wall time of ``--reps`` calls each, and the database's plan for the statement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event

from bench.harness import _PostgresDatabase
from persistence.migrate import upgrade_async
from persistence.sql import SqlStore, open_store

__all__ = ["fill", "main", "measure", "plan", "statements"]

#: One response in this many is unfinished; one in three is owned by ``_OWNER``.
_UNFINISHED_EVERY = 10_000
_OWNER = "rep_sweeps"

_FILL_POSTGRES = """
INSERT INTO responses (id, model, status, created_at, background, request, owner)
SELECT 'resp_' || g, 'm', CASE WHEN g % $2 = 0 THEN 'in_progress' ELSE 'completed' END,
       1700000000 + g, false, '{}'::jsonb, CASE WHEN g % 3 = 0 THEN $3 END
FROM generate_series(1, $1) AS g
"""


def _fill_sqlite(path: str, rows: int, unfinished_every: int) -> None:
    con = sqlite3.connect(path)
    try:
        con.executemany(
            "INSERT INTO responses (id, model, status, created_at, background, request, owner)"
            " VALUES (?, 'm', ?, ?, 0, '{}', ?)",
            (
                (
                    f"resp_{g}",
                    "in_progress" if g % unfinished_every == 0 else "completed",
                    1_700_000_000 + g,
                    _OWNER if g % 3 == 0 else None,
                )
                for g in range(1, rows + 1)
            ),
        )
        con.commit()
        con.execute("ANALYZE")
    finally:
        con.close()


async def _fill_postgres(dsn: str, rows: int, unfinished_every: int) -> None:
    con = await asyncpg.connect(dsn)
    try:
        await con.execute(_FILL_POSTGRES, rows, unfinished_every, _OWNER)
        await con.execute("ANALYZE responses")
    finally:
        await con.close()


async def fill(url: str, rows: int, *, unfinished_every: int = _UNFINISHED_EVERY) -> None:
    """Migrate the database at ``url`` and store ``rows`` responses in it (one in
    ``unfinished_every`` unfinished; more than ``rows``: none), then ``ANALYZE`` it. Their rows
    only, no events: what the periodic queries and the planners see of a long history."""
    await upgrade_async(url)
    if url.startswith("sqlite"):
        _fill_sqlite(url.split("///", 1)[1], rows, unfinished_every)
    else:
        await _fill_postgres(
            url.replace("postgresql+asyncpg", "postgresql"), rows, unfinished_every
        )


async def plan(url: str, statement: str, parameters: Any, *, seqscan: bool = True) -> list[str]:
    """The lines of the database's plan for ``statement`` with ``parameters`` (as the store's
    driver sent them). ``seqscan=False``: PostgreSQL's sequential scans made as dear as they
    go, so that a plan on a small table names an index wherever one can answer."""
    if url.startswith("sqlite"):
        con = sqlite3.connect(url.split("///", 1)[1])
        try:
            rows = con.execute(f"EXPLAIN QUERY PLAN {statement}", tuple(parameters)).fetchall()
        finally:
            con.close()
        return [str(row[-1]) for row in rows]
    pg = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        if not seqscan:
            await pg.execute("SET enable_seqscan = off")
        rows = await pg.fetch(f"EXPLAIN {statement}", *parameters)
    finally:
        await pg.close()
    return [row[0].strip() for row in rows]


@contextlib.asynccontextmanager
async def statements(store: SqlStore, marker: str = "") -> AsyncIterator[list[tuple[str, Any]]]:
    """The statements (with their parameters, as the driver got them) holding ``marker`` that
    the store's reads send while the block runs."""
    sent: list[tuple[str, Any]] = []

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if marker in statement:
            sent.append((statement, parameters))

    engine = store._reader.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


async def _time_calls(store: SqlStore, url: str, reps: int) -> dict[str, Any]:
    calls = {
        "sweep": lambda: store.unfinished(owned_by_others_than=["rep_other"]),
        "cancel_requests": lambda: store.cancel_requests(_OWNER),
    }
    out: dict[str, Any] = {}
    for name, call in calls.items():
        times, found = [], 0
        for _ in range(reps):
            started = time.perf_counter()
            found = len(await call())
            times.append(time.perf_counter() - started)
        async with statements(store) as sent:
            await call()
        statement, parameters = sent[-1]
        out[name] = {
            "ms": statistics.median(times) * 1e3,
            "rows": found,
            "plan": "; ".join(
                line
                for line in await plan(url, statement, parameters)
                if not url.startswith("postgres") or "Scan" in line
            ),
        }
    return out


async def measure(url: str, rows: int, reps: int) -> dict[str, Any]:
    """Fill the empty database at ``url`` with ``rows`` responses and time the calls."""
    started = time.perf_counter()
    await fill(url, rows)
    filled_s = time.perf_counter() - started
    store = await open_store(url, migrate=False)
    try:
        calls = await _time_calls(store, url, reps)
    finally:
        await store.close()
    return {"rows": rows, "fill_s": filled_s, **calls}


def _run(backend: str, rows: int, reps: int) -> dict[str, Any]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-sweeps-") as tmp:
            return asyncio.run(
                measure(f"sqlite+aiosqlite:///{Path(tmp) / 'ledger.db'}", rows, reps)
            )
    database = _PostgresDatabase()
    database.create()
    try:
        return asyncio.run(measure(database.url, rows, reps))
    finally:
        database.drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sweeps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    print(
        f"{args.rows:,} responses, one in {_UNFINISHED_EVERY:,} unfinished; median of {args.reps} calls"
    )
    print("| store | call | ms | rows | plan |")
    print("|---|---|--:|--:|---|")
    for backend in backends:
        result = _run(backend, args.rows, args.reps)
        for name in ("sweep", "cancel_requests"):
            call = result[name]
            print(f"| {backend} | {name} | {call['ms']:.2f} | {call['rows']} | {call['plan']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

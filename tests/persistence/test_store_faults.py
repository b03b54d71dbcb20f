"""The store under faults (issue 14): a refused row fails alone, an unavailable database is
retried for a bounded time and then reported, a commit whose answer was lost is not written
twice, and ``health`` follows what the database does.

The locks here are real: another connection holds SQLite's write lock (``BEGIN IMMEDIATE``)
or PostgreSQL's table lock, exactly what a second process or an operator's session does.
Whole-cluster faults (restart, stop, freeze, full disk, read-only) are in ``tests/faults``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from persistence.errors import RefusedWrite, StoreError, StoreUnavailable
from persistence.sql import SqlStore, open_store
from tests.persistence.factories import created, delta, new_response
from tests.support.postgres import fresh_database, unavailable
from tests.support.sqlite_lock import SqliteLock


async def _started(store: SqlStore) -> str:
    new = new_response()
    await store.create_response(new)
    await store.append(new.id, [created(new.id)], 0)
    return new.id


async def test_a_refused_row_fails_alone_and_its_batch_commits(sql_url: str) -> None:
    """24 responses append in the same commit as a create the database refuses (a created_at
    beyond BIGINT: SQLite's driver raises OverflowError, PostgreSQL refuses it as data). Only
    that create fails; every other write of the batch is durable."""
    store = await open_store(sql_url, commit_window_ms=20.0)
    try:
        good = [await _started(store) for _ in range(24)]
        bad = new_response(created_at=2**70)
        writes = [store.submit(rid, [delta(1, "ok")], 1) for rid in good]
        refused = store.submit_create(bad)
        writes += [store.submit(rid, [delta(2, "again")], 2) for rid in good]
        results = await asyncio.gather(*writes, refused, return_exceptions=True)
        assert isinstance(results[-1], RefusedWrite), results[-1]
        assert [r for r in results[:-1] if r is not None] == []
        for rid in good:
            assert [e.seq for e in await store.load(rid)] == [0, 1, 2]
        assert await store.get(bad.id) is None
        assert store.health.ok
    finally:
        await store.close()


async def test_a_lone_surrogate_is_refused_when_submitted(sql_url: str) -> None:
    """A lone surrogate (what a JSON ``\\udfff`` escape decodes to) cannot be encoded by any
    driver: it is refused at submission, before it can share (and fail) a commit."""
    store = await open_store(sql_url)
    try:
        rid = await _started(store)
        poisoned = new_response()
        poisoned.request["metadata"] = {"k": "\udfff"}
        with pytest.raises(ValueError, match="surrogate"):
            store.submit_create(poisoned)
        await store.append(rid, [delta(1, "still fine")], 1)
        assert [e.seq for e in await store.load(rid)] == [0, 1]
    finally:
        await store.close()


async def test_a_locked_sqlite_database_is_retried_until_it_is_free(sqlite_url: str) -> None:
    path = Path(sqlite_url.split("///", 1)[1])
    store = await open_store(sqlite_url, busy_timeout_ms=50, retry_s=10)
    try:
        rid = await _started(store)
        with SqliteLock(path, hold_s=1.0):
            started = time.monotonic()
            write = store.submit(rid, [delta(1, "waited")], 1)
            await asyncio.sleep(0.5)
            assert store.health.failing and "locked" in (store.health.reason or "")
            assert not write.done()  # paused, not failed
            await write
        assert time.monotonic() - started >= 0.5
        assert store.health.ok
        assert [e.seq for e in await store.load(rid)] == [0, 1]
    finally:
        await store.close()


async def test_a_lock_held_past_the_retry_time_fails_writes_then_heals(sqlite_url: str) -> None:
    path = Path(sqlite_url.split("///", 1)[1])
    store = await open_store(sqlite_url, busy_timeout_ms=50, retry_s=0.4)
    try:
        rid = await _started(store)
        with SqliteLock(path, hold_s=1.5):
            with pytest.raises(StoreUnavailable, match="locked"):
                await store.append(rid, [delta(1, "lost")], 1)
            # the outage is older than the retry time: the next write fails at once
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.append(rid, [delta(1, "lost")], 1)
            assert time.monotonic() - started < 0.4
            await store.probe()
            assert store.health.failing
        await store.probe()
        assert store.health.ok and store.health.reason is None
        await store.append(rid, [delta(1, "after")], 1)
        assert [e.seq for e in await store.load(rid)] == [0, 1]
    finally:
        await store.close()


async def test_a_commit_whose_answer_was_lost_is_not_written_twice(sqlite_url: str) -> None:
    """The commit outlives its statement timeout (it waits for a lock inside SQLite, and the
    store stops waiting for it), then goes through. The retry finds it in the log and reports
    success instead of writing it again or failing with a conflict."""
    path = Path(sqlite_url.split("///", 1)[1])
    store = await open_store(sqlite_url, busy_timeout_ms=5000, statement_timeout_s=0.2, retry_s=10)
    try:
        rid = await _started(store)
        with SqliteLock(path, hold_s=0.8):
            await store.append(rid, [delta(1, "once"), delta(2, "only")], 1)
        events = await store.load(rid)
        assert [(e.seq, e.payload.get("delta")) for e in events[1:]] == [(1, "once"), (2, "only")]
        await store.append(rid, [delta(3, "next")], 3)
        assert [e.seq for e in await store.load(rid)] == [0, 1, 2, 3]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_locked_postgres_table_times_out_and_is_retried() -> None:
    """An operator's session holds an exclusive lock on the events table: the commit times out
    (statement timeout, server and client side), is retried, and lands once the lock goes."""
    reason = await unavailable()
    if reason is not None:
        pytest.skip(reason)
    async with fresh_database("ledger_locked") as url:
        store = await open_store(url, statement_timeout_s=0.3, retry_s=10)
        try:
            rid = await _started(store)
            operator = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
            try:
                transaction = operator.transaction()
                await transaction.start()
                await operator.execute("LOCK TABLE response_events IN ACCESS EXCLUSIVE MODE")
                write = asyncio.ensure_future(store.append(rid, [delta(1, "waited")], 1))
                await asyncio.sleep(1.0)
                assert not write.done() and store.health.failing
                await transaction.rollback()
                async with asyncio.timeout(10):
                    await write
            finally:
                await operator.close()
            assert store.health.ok
            assert [e.seq for e in await store.load(rid)] == [0, 1]
        finally:
            await store.close()


async def test_reads_of_an_impossible_id_are_not_found(sql_url: str) -> None:
    """A NUL or a lone surrogate in an id (a path parameter) cannot be in any row; PostgreSQL's
    driver would refuse the query. Such ids are simply not found."""
    store = await open_store(sql_url)
    try:
        for ident in ("resp_\x00x", "resp_\udfff"):
            assert await store.get(ident) is None
            assert await store.load(ident) == []
            assert await store.delete(ident) is False
            with pytest.raises(StoreError):
                await store.load_chain(ident)
    finally:
        await store.close()

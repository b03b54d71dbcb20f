"""What only the SQL store does: group commit, conflicts between replicas, the append-only
guarantee in the database itself, compact audit storage, failure without hanging."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, text

from bench.sweeps import plan, statements
from persistence.errors import ConcurrencyError, NotFound, StoreError
from persistence.migrate import current_async
from persistence.records import AuditRecord, StoredEvent
from persistence.sql import SqlStore, open_store
from tests.persistence.factories import HEAD, completed, created, delta, new_response
from tests.support.postgres import create_database, drop_database, unavailable


async def _started(store: SqlStore) -> str:
    new = new_response()
    await store.create_response(new)
    await store.append(new.id, [created(new.id)], 0)
    return new.id


async def _fetch(url: str, sql: str) -> list[tuple[object, ...]]:
    """Read with a plain driver connection, as an operator would."""
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.split("///", 1)[1])
        try:
            return [tuple(row) for row in connection.execute(sql).fetchall()]
        finally:
            connection.close()
    pg = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        return [tuple(row) for row in await pg.fetch(sql)]
    finally:
        await pg.close()


async def _execute(url: str, sql: str) -> None:
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            connection.execute(sql)
        finally:
            connection.close()
        return
    pg = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await pg.execute(sql)
    finally:
        await pg.close()


async def test_a_create_and_the_events_behind_it_share_one_commit(sql_url: str) -> None:
    store = await open_store(sql_url, commit_window_ms=5.0)
    try:
        new = new_response()
        before = store.stats
        await asyncio.gather(
            store.submit_create(new),
            store.submit(new.id, [created(new.id), delta(1, "hi")], 0),
            store.submit_audit(new.id, [AuditRecord("prompt_token_ids", (7,))]),
        )
        after = store.stats
        assert (after.transactions - before.transactions, after.events - before.events) == (1, 2)
    finally:
        await store.close()


async def test_concurrent_writers_share_transactions(sql_url: str) -> None:
    store = await open_store(sql_url, commit_window_ms=5.0)
    try:
        rids = [await _started(store) for _ in range(64)]
        before = store.stats

        async def writer(rid: str) -> None:
            for seq in range(1, 11):
                await store.append(rid, [delta(seq, "x" * 100)], seq)

        await asyncio.gather(*(writer(rid) for rid in rids))
        after = store.stats
        writes = after.writes - before.writes
        transactions = after.transactions - before.transactions
        assert (writes, after.events - before.events) == (640, 640)
        assert transactions <= writes // 8, (transactions, writes)
        for rid in rids:
            assert [e.seq for e in await store.load(rid)] == list(range(11))
    finally:
        await store.close()


async def test_a_conflict_between_replicas_fails_only_the_offending_submission(
    sql_url: str,
) -> None:
    # Two stores on one database are two replicas: each trusts its own view of the logs.
    a = await open_store(sql_url, commit_window_ms=200.0, migrate=False)
    b = await open_store(sql_url, commit_window_ms=1.0, migrate=False)
    try:
        contested = await _started(a)
        bystander = await _started(a)
        await b.append(contested, [delta(1, "b wins")], 1)  # a does not know about this
        # One batch in a (its window is long): the stale append and an innocent one.
        stale = a.submit(contested, [delta(1, "a loses")], 1)
        innocent = a.submit(bystander, [delta(1, "fine")], 1)
        results = await asyncio.gather(stale, innocent, return_exceptions=True)
        assert isinstance(results[0], ConcurrencyError)
        assert results[1] is None
        assert [e.payload.get("delta") for e in await a.load(contested)] == [None, "b wins"]
        assert [e.payload.get("delta") for e in await a.load(bystander)] == [None, "fine"]
        # a has forgotten its stale view: the next append at the true tail works.
        await a.append(contested, [delta(2, "a again")], 2)
        assert [e.seq for e in await b.load(contested)] == [0, 1, 2]
    finally:
        await a.close()
        await b.close()


async def test_replicas_racing_on_one_seq_leave_one_winner(sql_url: str) -> None:
    a = await open_store(sql_url, commit_window_ms=1.0, migrate=False)
    b = await open_store(sql_url, commit_window_ms=1.0, migrate=False)
    try:
        rid = await _started(a)
        await b.load(rid)
        for seq in range(1, 21):
            results = await asyncio.gather(
                a.append(rid, [delta(seq, "a")], seq),
                b.append(rid, [delta(seq, "b")], seq),
                return_exceptions=True,
            )
            assert sorted(type(r).__name__ for r in results) == ["ConcurrencyError", "NoneType"]
        events = await a.load(rid)
        assert [e.seq for e in events] == list(range(21))
    finally:
        await a.close()
        await b.close()


async def test_the_database_keeps_events_append_only(sql_url: str) -> None:
    store = await open_store(sql_url, migrate=False)
    try:
        rid = await _started(store)
        await store.append(rid, [delta(1)], 1)
    finally:
        await store.close()
    for sql in (
        f"UPDATE response_events SET type = 'x' WHERE response_id = '{rid}'",
        f"DELETE FROM response_events WHERE response_id = '{rid}' AND seq = 1",
    ):
        with pytest.raises((sqlite3.DatabaseError, asyncpg.PostgresError), match="append-only"):
            await _execute(sql_url, sql)
    assert await _fetch(sql_url, "SELECT count(*) FROM response_events") == [(2,)]
    await _execute(sql_url, f"DELETE FROM responses WHERE id = '{rid}'")
    assert await _fetch(sql_url, "SELECT count(*) FROM response_events") == [(0,)]


async def test_sqlite_delete_without_foreign_keys_still_cascades(
    migrated_sqlite_url: str,
) -> None:
    store = await open_store(migrated_sqlite_url, migrate=False)
    try:
        rid = await _started(store)
        await store.append_audit(rid, [AuditRecord("finish", detail={})])
    finally:
        await store.close()
    path = migrated_sqlite_url.split("///", 1)[1]
    connection = sqlite3.connect(path, isolation_level=None)  # foreign_keys is OFF here
    try:
        connection.execute("DELETE FROM responses WHERE id = ?", (rid,))
        counts = [
            connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("response_events", "response_input_items", "response_audit")
        ]
    finally:
        connection.close()
    assert counts == [0, 0, 0]


@pytest.mark.parametrize("foreign_keys", ["ON", "OFF"])
async def test_sqlite_a_delete_by_hand_during_a_stream_refuses_its_next_events(
    migrated_sqlite_url: str, foreign_keys: str
) -> None:
    """The writer keeps each live log's tail in memory, so what stops a ``DELETE FROM
    responses`` typed in ``sqlite3`` while the response streams from leaving the owner appending
    to a log without a response is the events' foreign key: the owner's next insert fails, its
    retry reads the log again and refuses it (``NotFound``). (An attempt to drop the key for
    its ~1 µs an event, bench/RESULTS.md, seventeenth session, failed this test.)"""
    store = await open_store(migrated_sqlite_url, migrate=False)
    path = migrated_sqlite_url.split("///", 1)[1]
    operator = sqlite3.connect(path, isolation_level=None)
    operator.execute(f"PRAGMA foreign_keys = {foreign_keys}")
    try:
        rid, other = await _started(store), await _started(store)
        for seq in range(1, 4):  # a stream's commits: its cached tail is enough
            await asyncio.gather(
                store.append(rid, [delta(seq)], seq), store.append(other, [delta(seq)], seq)
            )
        operator.execute("DELETE FROM responses WHERE id = ?", (rid,))
        with pytest.raises(NotFound):
            await store.append(rid, [delta(4)], 4)
        await store.append(other, [delta(4)], 4)  # the other log goes on
        with pytest.raises(NotFound):  # and it stays refused
            await store.append(rid, [delta(5)], 5)
        await store.append(other, [delta(5)], 5)
    finally:
        await store.close()
    rows = operator.execute(
        "SELECT response_id, count(*) FROM response_events GROUP BY response_id"
    ).fetchall()
    operator.close()
    assert rows == [(other, 6)]


async def test_audit_token_ids_are_stored_as_bytes(sql_url: str) -> None:
    store = await open_store(sql_url, migrate=False)
    try:
        rid = await _started(store)
        await store.append_audit(rid, [AuditRecord("prompt_token_ids", tuple(range(1000)))])
    finally:
        await store.close()
    ((count, data),) = await _fetch(sql_url, "SELECT token_count, token_ids FROM response_audit")
    assert count == 1000
    assert isinstance(data, bytes) and len(data) == 4000


async def test_a_cancelled_wait_does_not_cancel_the_write(sql_url: str) -> None:
    store = await open_store(sql_url, commit_window_ms=50.0, migrate=False)
    try:
        rid = await _started(store)
        waiter = asyncio.create_task(store.append(rid, [delta(1)], 1))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await store.append(rid, [delta(2)], 2)
        assert [e.seq for e in await store.load(rid)] == [0, 1, 2]
    finally:
        await store.close()


async def test_close_commits_what_was_submitted(sql_url: str) -> None:
    store = await open_store(sql_url, commit_window_ms=10_000.0, migrate=False)
    new = new_response()
    create = asyncio.create_task(store.create_response(new))
    await asyncio.sleep(0)
    futures = [store.submit(new.id, [created(new.id)], 0)]
    futures += [store.submit(new.id, [delta(seq)], seq) for seq in range(1, 50)]
    futures.append(store.submit(new.id, [completed(new.id, 50)], 50))
    await store.close()
    await create
    assert all(f.done() and f.exception() is None for f in futures)
    reopened = await open_store(sql_url, migrate=False)
    try:
        assert [e.seq for e in await reopened.load(new.id)] == list(range(51))
        row = await reopened.get(new.id)
        assert row is not None and row.status == "completed" and row.last_seq == 50
    finally:
        await reopened.close()


async def test_sqlite_stores_payload_json_verbatim(sqlite_url: str) -> None:
    store = await open_store(sqlite_url)
    text = '{"delta":"hi",  "item_id" : "msg_1"}'
    try:
        rid = await _started(store)
        await store.append(rid, [StoredEvent(1, "response.output_text.delta", {}, text)], 1)
        (event,) = await store.load(rid, after_seq=0)
        assert event.payload_json == text
    finally:
        await store.close()
    assert await _fetch(sqlite_url, "SELECT payload FROM response_events WHERE seq = 1") == [
        (text,)
    ]


async def test_sqlite_first_start_creates_and_migrates(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "responses.db"
    url = f"sqlite+aiosqlite:///{path}"
    store = await open_store(url)
    await store.close()
    assert path.exists()
    assert await current_async(url) == HEAD
    (mode,) = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()
    assert mode == "wal"
    again = await open_store(url)  # a second start migrates nothing and keeps the data
    await again.close()


async def test_sqlite_durability_setting_is_applied(sqlite_url: str) -> None:
    for setting, expected in (("FULL", 2), ("NORMAL", 1)):
        store = await open_store(sqlite_url, sqlite_synchronous=setting)  # type: ignore[arg-type]
        try:
            async with store._writer.connect() as conn:
                level = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar_one()
                keys = (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar_one()
            assert (level, keys) == (expected, 1)
        finally:
            await store.close()
    with pytest.raises(ValueError):
        await open_store(sqlite_url, sqlite_synchronous="OFF")  # type: ignore[arg-type]


async def test_an_unreachable_database_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        await open_store("postgresql+asyncpg://postgres@127.0.0.1:1/nowhere", migrate=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises((StoreError, OSError)):
        await open_store(f"sqlite+aiosqlite:///{blocker}/ledger.db")


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(ValueError, match="MemoryStore"):
        asyncio.run(open_store("sqlite+aiosqlite:///:memory:", migrate=False))


@contextlib.asynccontextmanager
async def _postgres_store(prefix: str) -> AsyncIterator[tuple[str, SqlStore]]:
    """A store on a PostgreSQL database of its own, dropped afterwards."""
    reason = await unavailable()
    if reason is not None:
        pytest.skip(reason)
    url = await create_database(prefix)
    store = await open_store(url, migrate=True)
    try:
        yield url, store
    finally:
        await store.close()
        await drop_database(url)


@pytest.mark.postgres
async def test_a_lost_database_fails_writes_instead_of_hanging() -> None:
    async with _postgres_store("ledger_lost") as (url, store):
        rid = await _started(store)
        await drop_database(url)
        async with asyncio.timeout(30):
            with pytest.raises(StoreError):
                await store.append(rid, [delta(1)], 1)
            with pytest.raises(StoreError):
                await store.get(rid)


@pytest.mark.postgres
async def test_a_killed_postgres_connection_is_replaced() -> None:
    """The writer's connection dies between commits (a restart, a failover, an operator's
    pg_terminate_backend): the pool must not hand it out again, so writes resume."""
    async with _postgres_store("ledger_killed") as (url, store):
        rid = await _started(store)
        await _execute(
            url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        seq = 1
        for _ in range(2):  # the first may still meet the dead connection
            try:
                await store.append(rid, [delta(seq, "after")], seq)
                seq += 1
                break
            except StoreError:
                continue
        await store.append(rid, [delta(seq, "again")], seq)
        assert [e.seq for e in await store.load(rid)] == list(range(seq + 1))


@pytest.mark.postgres
async def test_postgres_commits_keep_their_connection_until_it_fails() -> None:
    """A checkout from the pool and its check-in cost 72-104 µs of CPU, and a paced server
    commits every engine step: the commit task keeps one connection from commit to commit, and
    checks out another only after the one it had failed."""
    async with _postgres_store("ledger_held") as (url, store):
        rid = await _started(store)
        checkouts: list[int] = []
        pool = store._writer.sync_engine.pool

        def counted(*_: Any) -> None:
            checkouts.append(1)

        event.listen(pool, "checkout", counted)
        try:
            for seq in range(1, 21):
                await store.append(rid, [delta(seq)], seq)
            assert checkouts == []  # twenty commits, no checkout
            await _execute(
                url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            with contextlib.suppress(StoreError):  # it may meet the dead connection
                await store.append(rid, [delta(21)], 21)
            first = len(await store.load(rid))  # 21, or 22 if that append went through
            for seq in range(first, first + 5):
                await store.append(rid, [delta(seq)], seq)
            assert 1 <= len(checkouts) <= 2  # a new one after the loss, then kept
        finally:
            event.remove(pool, "checkout", counted)


def test_the_wal_switch_waits_out_a_lock_that_fails_it_at_once(tmp_path: Path) -> None:
    import threading

    from persistence.database import _switch_to_wal

    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (a)")
    holder.execute("BEGIN EXCLUSIVE")  # another process migrating the new file
    opener = sqlite3.connect(path, isolation_level=None)
    opener.execute("PRAGMA busy_timeout = 0")  # the switch gets no busy wait from SQLite
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        opener.execute("PRAGMA journal_mode = WAL")
    release = threading.Timer(0.2, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        _switch_to_wal(opener.cursor(), busy_timeout_ms=10_000)
        assert opener.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        release.join()
        holder.close()
        opener.close()
    # a lock that outlasts busy_timeout is still an error
    other = tmp_path / "other.db"
    holder = sqlite3.connect(other, isolation_level=None)
    holder.execute("CREATE TABLE t (a)")
    holder.execute("BEGIN EXCLUSIVE")
    opener = sqlite3.connect(other, isolation_level=None, timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _switch_to_wal(opener.cursor(), busy_timeout_ms=50)
    finally:
        holder.close()
        opener.close()


@pytest.mark.postgres
async def test_postgres_queries_are_not_jit_compiled(clean_postgres_url: str) -> None:
    """A look-up whose cost estimate crossed ``jit_above_cost`` (a table just filled, without
    statistics) spent 1.1 s compiling for 0.5 ms of work: the store's connections run without JIT."""
    store = await open_store(clean_postgres_url, migrate=False)
    try:
        async with store._read() as conn:
            assert (await conn.execute(text("SHOW jit"))).scalar_one() == "off"
    finally:
        await store.close()


async def test_the_periodic_queries_for_unfinished_responses_read_the_status_index(
    sql_url: str,
) -> None:
    # Every replica runs these every second or so (the orphan sweep, its cancel requests): a
    # scan of ``responses`` would cost the database time in proportion to every response ever
    # stored (measured: 97-149 ms a sweep at a million rows, against 1.5 through the index).
    # Each statement the store sends is explained on its own database.
    store = await open_store(sql_url)
    try:
        await _started(store)
        async with statements(store, "FROM responses") as sent:
            assert len(await store.unfinished(owned_by_others_than=["rep_a"])) == 1
            assert await store.cancel_requests("rep_a") == []
    finally:
        await store.close()
    assert len(sent) == 2
    for statement, parameters in sent:
        plan = await _plan(sql_url, statement, parameters)
        assert "ix_responses_status" in plan, (statement, plan)


async def test_a_previous_response_chain_is_walked_by_key(sql_url: str) -> None:
    # Every request naming a previous_response_id walks its chain: each step, and each ended
    # response's last event, must be a look-up by key, never a pass over a table (SQLite, with the statistics of a table under
    # a million rows, built a Bloom filter over all of ``responses`` for each walk: 17-22 ms at
    # 200,000 rows, 86 at 800,000).
    store = await open_store(sql_url)
    try:
        first = await _started(store)
        second = new_response(previous=first)
        await store.create_response(second)
        async with statements(store, "WITH RECURSIVE") as sent:
            chain = await store.load_chain(second.id)
    finally:
        await store.close()
    assert [link.row.id for link in chain] == [first, second.id]
    ((statement, parameters),) = sent
    plan = await _plan(sql_url, statement, parameters)
    for table in ("responses", "response_events"):  # (its last events are read by key too)
        assert f"SCAN {table}" not in plan and f"Seq Scan on {table}" not in plan, plan
    assert "BLOOM" not in plan, plan


async def _plan(url: str, statement: str, parameters: Any) -> str:
    """The database's plan for ``statement``, as text: SQLite's with the statistics ``ANALYZE``
    leaves for 200,000 responses, half of them of one status (what SQLite's statistics say of a
    table where nearly all are ``completed``: they keep no skew); PostgreSQL's with sequential
    scans made as dear as they go, so a plan names an index wherever one can answer."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1]
        connection = sqlite3.connect(path)
        try:
            connection.execute("ANALYZE")
            connection.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'responses'")
            connection.executemany(
                "INSERT INTO sqlite_stat1 VALUES ('responses', ?, ?)",
                [
                    (name, "200000 1")
                    for name in ("sqlite_autoindex_responses_1", "ix_responses_created_at")
                ]
                + [("ix_responses_status", "200000 100000"), (None, "200000")],
            )
            connection.commit()
        finally:
            connection.close()
    return "\n".join(await plan(url, statement, parameters, seqscan=False))

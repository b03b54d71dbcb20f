"""The contract suite against every backend: memory, SQLite (temp file), PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import event, text

from persistence import sql
from persistence.doorbell import PgDoorbell
from persistence.errors import Fenced, NotFound
from persistence.memory import MemoryStore
from persistence.records import AuditRecord, NewResponse, Replica
from persistence.sql import (
    _OWN_FENCE,
    SqlStore,
    _column_value,
    open_store,
)
from persistence.store import REPLICAS_CHANNEL, EventStore
from tests.persistence.contract import EventStoreContract
from tests.persistence.factories import completed, created, delta, new_response, user_message
from tests.support.waiting import eventually


class TestMemoryStore(EventStoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = MemoryStore()
        yield store
        await store.close()


class TestSqliteStore(EventStoreContract):
    @pytest.fixture
    async def store(self, migrated_sqlite_url: str) -> AsyncIterator[EventStore]:
        store = await open_store(migrated_sqlite_url, commit_window_ms=1.0, migrate=False)
        yield store
        await store.close()


@pytest.mark.postgres
class TestPostgresStore(EventStoreContract):
    @pytest.fixture
    async def store(self, clean_postgres_url: str) -> AsyncIterator[EventStore]:
        store = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
        yield store
        await store.close()


@pytest.mark.postgres
async def test_a_claim_fences_out_the_old_owners_appends(clean_postgres_url: str) -> None:
    """Two stores on one database, as two replicas: once B claims A's response, A's appends
    fail with ``Fenced`` and B's go on at the next seq."""
    a = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
    b = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
    try:
        new = dataclasses.replace(new_response(), owner="rep_a")
        await a.create_response(new)
        await a.append(new.id, [created(new.id), delta(1)], 0)
        assert await b.claim(new.id, "rep_a", "rep_b") == 1
        with pytest.raises(Fenced):
            await a.append(new.id, [delta(2, "late")], 2)
        await b.append(new.id, [delta(2, "b's")], 2)
        await b.append(new.id, [completed(new.id, 3)], 3)
        assert [e.seq for e in await a.load(new.id)] == [0, 1, 2, 3]
        assert (await a.load(new.id))[2].payload["delta"] == "b's"
        # deleted by B while A writes: A's next append finds no row and leaves none
        other = dataclasses.replace(new_response(), owner="rep_a")
        await a.create_response(other)
        await a.append(other.id, [created(other.id)], 0)
        assert await b.delete(other.id)
        with pytest.raises(NotFound):
            await a.append(other.id, [delta(1)], 1)
        assert await a.load(other.id) == []
    finally:
        await a.close()
        await b.close()


async def _leased(url: str, replica_id: str) -> SqlStore:
    """A store holding ``replica_id``'s lease, as a server's does, after its first heartbeat
    (its row in ``replicas``)."""
    store = await open_store(url, commit_window_ms=1.0, migrate=False)
    now = time.time()
    store.lease(Replica(replica_id, "host", 1, now, now, now + 60), 60)
    await store.probe()
    return store


async def _owned_log(store: SqlStore, owner: str) -> NewResponse:
    """A response ``owner`` created through ``store``, its log begun."""
    response = dataclasses.replace(new_response(), owner=owner)
    await store.create_response(response)
    await store.append(response.id, [created(response.id)], 0)
    return response


@pytest.mark.postgres
async def test_a_leased_replica_fences_its_logs_by_its_own_row_and_still_loses_them(
    clean_postgres_url: str,
) -> None:
    """With a lease, a commit checks a log's epoch row by row only once: then it locks its own
    replica row alone. A claim, an API delete or a delete by hand in SQL of one of its responses
    still stops its appends at once; after one, its other logs are checked row by row once more."""
    a = await _leased(clean_postgres_url, "rep_a")
    b = await _leased(clean_postgres_url, "rep_b")
    try:
        claimed, kept, deleted, by_hand = [await _owned_log(a, "rep_a") for _ in range(4)]
        for seq in (1, 2):
            for response in (claimed, kept, deleted, by_hand):
                await a.append(response.id, [delta(seq)], seq)
        assert a.fence_row_checks == 0  # created here: each log's fence was its replica's row
        # and every commit but the first (which read the fence) was one statement, new rows too
        assert a.one_trip_commits == 15

        assert await b.claim(claimed.id, "rep_a", "rep_b") == 1
        with pytest.raises(Fenced):
            await a.append(claimed.id, [delta(3, "late")], 3)
        await a.append(kept.id, [delta(3)], 3)  # checked row by row once more, then not
        await a.append(kept.id, [delta(4)], 4)
        assert a.fence_row_checks == 2
        assert a.one_trip_commits == 16  # not the refused one (its fence had moved), nor seq 3

        assert await b.delete(deleted.id)
        with pytest.raises(NotFound):
            await a.append(deleted.id, [delta(3)], 3)
        assert await a.load(deleted.id) == []

        async with a._writer.begin() as conn:  # what an operator types in psql
            await conn.execute(text(f"DELETE FROM responses WHERE id = '{by_hand.id}'"))
        with pytest.raises(NotFound):
            await a.append(by_hand.id, [delta(3)], 3)
        assert await a.load(by_hand.id) == []

        await a.append(kept.id, [completed(kept.id, 5)], 5)
        assert [e.seq for e in await b.load(kept.id)] == [0, 1, 2, 3, 4, 5]
        await b.append(claimed.id, [delta(3, "b's")], 3)
        assert (await b.load(claimed.id))[3].payload["delta"] == "b's"
    finally:
        await a.close()
        await b.close()


@pytest.mark.postgres
async def test_a_replica_row_that_comes_back_does_not_vouch_for_logs_claimed_meanwhile(
    clean_postgres_url: str,
) -> None:
    """A drain removes the replica's row; a claim then has no row to bump. If the row comes back
    (the next heartbeat), its fence must not match the value the replica knew its logs by."""
    a = await _leased(clean_postgres_url, "rep_a")
    b = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
    try:
        response = await _owned_log(a, "rep_a")
        await a.append(response.id, [delta(1)], 1)
        await a.release("rep_a")
        assert await b.claim(response.id, "rep_a", "rep_b") == 1
        await a.probe()  # the row again, with a new fence
        with pytest.raises(Fenced):
            await a.append(response.id, [delta(2, "late")], 2)
    finally:
        await a.close()
        await b.close()


@pytest.mark.postgres
async def test_a_delete_by_hand_during_an_owners_commit_leaves_none_of_its_events(
    clean_postgres_url: str,
) -> None:
    """A commit that trusts its replica's row holds it share-locked and inserts events without
    touching the response's row. A ``DELETE FROM responses`` typed in psql meanwhile must wait
    for that commit (its trigger bumps the replica's fence before the row goes), so that the
    events the commit made go with the response instead of staying behind without it."""
    a = await _leased(clean_postgres_url, "rep_a")
    dsn = clean_postgres_url.replace("postgresql+asyncpg", "postgresql")
    owner, operator = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        response = await _owned_log(a, "rep_a")
        commit = owner.transaction()
        await commit.start()  # the owner's commit, as SqlStore._fence's shortcut makes it
        await owner.fetchval(_OWN_FENCE, "rep_a")
        await owner.execute(
            "INSERT INTO response_events (response_id, seq, type, payload, recorded_at)"
            " VALUES ($1, 1, 'response.output_text.delta', '{}', 0)",
            response.id,
        )
        delete = asyncio.create_task(
            operator.execute(f"DELETE FROM responses WHERE id = '{response.id}'")
        )
        await asyncio.sleep(0.3)
        assert not delete.done()  # it waits for the commit
        await commit.commit()
        await delete
        assert (
            await owner.fetchval(
                "SELECT count(*) FROM response_events WHERE response_id = $1", response.id
            )
            == 0
        )
    finally:
        await owner.close()
        await operator.close()
        await a.close()


@pytest.mark.postgres
async def test_a_leases_first_heartbeat_rings_the_other_replicas_once(
    clean_postgres_url: str,
) -> None:
    """A replica that starts tells the others at once (``REPLICAS``), so one that believed
    itself alone rings its commits for other processes again without waiting for its sweep;
    the heartbeats after the first ring nothing. Heard by a session LISTENing as a replica's
    doorbell does."""
    dsn = clean_postgres_url.replace("postgresql+asyncpg", "postgresql")
    heard: list[str] = []
    listener = await asyncpg.connect(dsn)
    for channel in (REPLICAS_CHANNEL, "sentinel"):
        await listener.add_listener(channel, lambda *args: heard.append(args[2]))
    store = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
    store.doorbell = doorbell = PgDoorbell(dsn)
    await doorbell.start()
    try:
        now = time.time()
        store.lease(Replica("rep_new", "host", 1, now, now, now + 60), 60)
        await store.probe()  # the first heartbeat
        await eventually(lambda: heard == [REPLICAS_CHANNEL], "the first heartbeat's ring")
        await store.probe()
        await store.probe()
        doorbell.ring("sentinel")  # notifications arrive in order: the probes' would be in by now
        await eventually(lambda: heard[-1:] == ["sentinel"], "the sentinel")
        assert heard == [REPLICAS_CHANNEL, "sentinel"]
    finally:
        await doorbell.close()
        await store.close()
        await listener.close()


#: What asyncpg asks a new connection the first time a statement uses a type it has not met (a
#: ``bytea[]`` parameter): not the store's statements.
_INTROSPECTION = ("\n", "WITH RECURSIVE typeinfo_tree")


@pytest.mark.postgres
async def test_a_leased_replicas_commit_is_one_statement_once_it_knows_its_fence(
    clean_postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a replica has read its row's ``fence``, a commit of its own logs is one statement in
    one round trip: the replica row's share lock and every row (``_Statements.fenced``), be it a
    paced engine's deltas, a new response with its first events (the row inserted with the
    change they make), or the terminal events with the row's change and audit records. After a
    claim bumps the fence that statement writes nothing, and the commit goes the long way: BEGIN
    with the lock, whose check fails too, the row read as before; the log that was claimed is
    fenced out, the other one goes on. Any number of rows goes as one statement; the first commit
    (the fence not yet read), and one whose values take more than ``_ONE_STATEMENT_MAX_BYTES``,
    are BEGIN, their statements (``COPY`` for many rows), COMMIT."""
    a = await _leased(clean_postgres_url, "rep_a")
    b = await _leased(clean_postgres_url, "rep_b")
    statements: list[str] = []
    await a._writer.dispose()  # its next connections log what they run
    one = "WITH own AS"  # (as the logger below cuts it)

    def log_query(logged: asyncpg.connection.LoggedQuery) -> None:
        if not logged.query.startswith(_INTROSPECTION):
            statements.append(logged.query.split(" (")[0])

    def log_queries(dbapi_connection: object, _record: object) -> None:
        raw = dbapi_connection._connection  # type: ignore[attr-defined]  # the asyncpg one
        raw.add_query_logger(log_query)

    event.listen(a._writer.sync_engine, "connect", log_queries)
    copy = asyncpg.Connection.copy_records_to_table  # (not logged: its rows go another way)

    async def logged_copy(self: asyncpg.Connection, table: str, **kwargs: object) -> str:
        done: str = await copy(self, table, **kwargs)  # type: ignore[arg-type]
        asyncio.get_running_loop().call_soon(statements.append, f"COPY {table}")  # as asyncpg logs
        return done

    monkeypatch.setattr(asyncpg.Connection, "copy_records_to_table", logged_copy)
    try:
        kept = await _owned_log(a, "rep_a")  # the fence is read: BEGIN, the row, ...
        assert [s.split(" ")[0] for s in statements] == [
            "BEGIN",
            "SELECT",
            "INSERT",
            "INSERT",
            "INSERT",
            "COMMIT",
            "WITH",
        ]
        statements.clear()
        # a new response and its first event, which changes its row, in one commit
        claimed = dataclasses.replace(new_response(), owner="rep_a")
        first = a.submit_create(claimed)
        await a.append(claimed.id, [created(claimed.id, status="queued")], 0)
        await first
        assert statements == [one]
        row = await b.get(claimed.id)
        assert row is not None and (row.status, row.owner, row.last_seq) == ("queued", "rep_a", 0)
        items, more = await b.list_input_items(claimed.id, after=None, limit=100, order="asc")
        assert len(items) == len(claimed.input_items) > 0 and not more
        await a.append(kept.id, [delta(1)], 1)
        statements.clear()
        await a.append(kept.id, [delta(2)], 2)
        assert statements == [one]
        statements.clear()
        await a.append(kept.id, [delta(seq) for seq in range(3, 43)], 3)
        assert statements == [one]
        statements.clear()
        await a.append(kept.id, [delta(seq) for seq in range(43, 2043)], 43)  # 2,000 rows
        assert statements == [one]
        statements.clear()
        limit = sql._ONE_STATEMENT_MAX_BYTES
        monkeypatch.setattr(sql, "_ONE_STATEMENT_MAX_BYTES", 4000)  # 40 deltas take more
        end = 2043 + 40
        await a.append(kept.id, [delta(seq) for seq in range(2043, end)], 2043)
        assert [s.split(" ")[0] for s in statements] == ["BEGIN;", "COPY", "COMMIT"]
        monkeypatch.setattr(sql, "_ONE_STATEMENT_MAX_BYTES", limit)

        assert await b.claim(claimed.id, "rep_a", "rep_b") == 1
        statements.clear()
        with pytest.raises(Fenced):
            await a.append(claimed.id, [delta(1, "late")], 1)
        assert statements[:3] == [one, statements[1], _OWN_FENCE]
        assert statements[1].startswith("BEGIN;")  # its check failed: the row is read as before
        await a.append(kept.id, [delta(end)], end)
        statements.clear()
        # its end: the terminal event, the row's change and the audit records, one statement
        audit = a.submit_audit(kept.id, [AuditRecord("output_token_ids", (7, 8, 9))])
        await a.append(kept.id, [completed(kept.id, end + 1)], end + 1)
        await audit
        assert statements == [one]
        assert [e.seq for e in await b.load(kept.id)] == list(range(end + 2))
        assert [e.seq for e in await b.load(claimed.id)] == [0]
        row = await b.get(kept.id)
        assert row is not None
        assert (row.status, row.completed_at, row.input_tokens, row.output_tokens) == (
            "completed",
            1_700_000_100,
            10,
            5,
        )
        assert [(r.kind, r.token_ids) for r in await b.load_audit(kept.id)] == [
            ("output_token_ids", (7, 8, 9))
        ]
    finally:
        event.remove(a._writer.sync_engine, "connect", log_queries)
        await a.close()
        await b.close()


def test_a_one_statement_commit_sends_a_column_as_one_text_where_its_values_allow() -> None:
    """Texts joined by the separator, numbers by commas in their exact ``repr``, byte strings in
    hex (``-``: NULL); an array where a value is NULL, holds the separator or is a lone empty
    text (which would split into no values at all), and for every other type."""
    assert _column_value("TEXT", ("a", "b")) == ("text", "a\x1fb")
    assert _column_value("JSONB", ('{"a": "\\u001f"}', "[]")) == ("text", '{"a": "\\u001f"}\x1f[]')
    assert _column_value("TEXT", ("", "")) == ("text", "\x1f")
    assert _column_value("TEXT", ("a\x1f", "b")) == ("array", ["a\x1f", "b"])
    assert _column_value("TEXT", ("",)) == ("array", [""])
    assert _column_value("TEXT", ("a", None)) == ("array", ["a", None])
    assert _column_value("INTEGER", (1, -2, 2**31 - 1)) == ("number", "1,-2,2147483647")
    assert _column_value("BIGINT", (1, None)) == ("array", [1, None])
    assert _column_value("DOUBLE PRECISION", (0.1, 1e300, 1_700_000_000.1234567)) == (
        "number",
        "0.1,1e+300,1700000000.1234567",
    )
    assert _column_value("DOUBLE PRECISION", (1.5, 2)) == (
        "array",
        [1.5, 2],
    )  # an int: its own encoding
    assert _column_value("BYTEA", (b"\x01\xff", None, b"")) == ("hex", "01ff,-,")
    assert _column_value("BYTEA", (b"",)) == ("array", [b""])
    assert _column_value("BOOLEAN", (True, False)) == ("array", [True, False])


@pytest.mark.postgres
async def test_a_one_statement_commit_stores_every_value_as_written(
    clean_postgres_url: str,
) -> None:
    """Whichever way the one-statement commit sends each column (``_column_value``), the rows read
    back are the ones written: ids and JSON holding the separator (raw, or escaped in JSON),
    NULLs, empty texts, token ids up to 2**32 - 1 and none, a time to the last bit."""
    a = await _leased(clean_postgres_url, "rep_a")
    b = await _leased(clean_postgres_url, "rep_b")
    try:
        kept = await _owned_log(a, "rep_a")  # the fence is read: its commits are one statement
        a._clock = lambda: 1_700_000_000.1234567  # type: ignore[method-assign]
        items = [
            user_message("a\x1fb \u00e9 \U0001f600", item_id="msg_\x1fodd"),
            user_message("", item_id="msg_plain"),
        ]
        odd = dataclasses.replace(new_response(input_items=items), owner="rep_a")
        transactions, one_trip = a.stats.transactions, a.one_trip_commits
        creating = a.submit_create(odd)
        opening = a.submit(odd.id, [created(odd.id)], 0)
        tokens = a.submit(kept.id, [delta(1, "x\x1fy")], 1, token_ids=(5, 2**32 - 1))
        no_tokens = a.submit(kept.id, [delta(2, "")], 2)
        await asyncio.gather(creating, opening, tokens, no_tokens)
        assert a.one_trip_commits - one_trip == a.stats.transactions - transactions > 0

        listed, more = await b.list_input_items(odd.id, after=None, limit=10, order="asc")
        assert [item["id"] for item in listed] == ["msg_\x1fodd", "msg_plain"] and not more
        assert [item["content"] for item in listed] == [item["content"] for item in items]
        row = await b.get(odd.id)
        assert row is not None and (row.previous_response_id, row.api_key_id, row.owner) == (
            None,
            None,
            "rep_a",
        )
        assert [e.payload.get("delta") for e in await b.load(kept.id, after_seq=0)] == [
            "x\x1fy",
            "",
        ]
        assert await b.output_token_writes(kept.id) == [[5, 2**32 - 1]]
        assert [t for _, _, t in await b.load_times(kept.id)][1:] == [1_700_000_000.1234567] * 2
    finally:
        await a.close()
        await b.close()


@pytest.mark.postgres
async def test_a_one_statement_commit_stamps_its_rows_with_its_own_time(
    clean_postgres_url: str,
) -> None:
    """The events and audit records of one one-statement commit share one ``recorded_at``: the
    time the commit read as it sent them (one parameter), not each write's when it was queued."""
    a = await _leased(clean_postgres_url, "rep_a")
    try:
        kept = await _owned_log(a, "rep_a")  # the fence is read: its commits are one statement
        readings: list[float] = []

        def clock() -> float:
            readings.append(1_700_000_000.0 + 0.25 * len(readings))
            return readings[-1]

        a._clock = clock  # type: ignore[method-assign]
        one_trip = a.one_trip_commits
        writes = [
            a.submit(kept.id, [delta(1, "x")], 1, token_ids=(5,)),
            a.submit(kept.id, [delta(2, "y")], 2),
            a.submit_audit(kept.id, [AuditRecord("output_token_ids", (7, 8))]),
        ]
        queued = len(readings)  # (the clock as far as the three writes, queued, read it)
        await asyncio.gather(*writes)
        assert a.one_trip_commits == one_trip + 1  # the three writes, one commit
        committed_at = readings[-1]
        assert len(readings) > queued  # read after every write was queued
        assert [t for _, _, t in await a.load_times(kept.id)][1:] == [committed_at] * 2
        async with a._writer.connect() as conn:
            audited = (
                (
                    await conn.execute(
                        text("SELECT recorded_at FROM response_audit WHERE response_id = :id"),
                        {"id": kept.id},
                    )
                )
                .scalars()
                .all()
            )
        assert audited == [committed_at]
    finally:
        await a.close()

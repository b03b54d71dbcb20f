"""The event store on SQLite or PostgreSQL.

Writes (``create_response``/``submit_create``, ``submit``/``append``, ``append_audit``/
``submit_audit``) all go through one ``GroupCommit`` queue, so a streamed token never costs its
own transaction: each batch is one transaction, written with ``executemany`` of pre-built
parameter tuples (no ORM objects, no per-event SQL compilation, the caller's ``payload_json``
passed through verbatim). On SQLite the whole transaction runs as one function on the writer
thread of :mod:`persistence.sqlite_writer` (plain ``sqlite3``); on PostgreSQL it runs on the
asyncpg connection under a pooled SQLAlchemy connection, with the inserts as binary ``COPY``
(a 500-event commit 5.6 -> 3.4 ms, 9.5 -> 5.5 us of PostgreSQL CPU per row against
``executemany``; SQLAlchemy added ~0.3 ms per statement on top), except a commit of this
replica's own logs (a stream's steps, new responses, their ends) whose values take up to
``_ONE_STATEMENT_MAX_BYTES``: one statement, its own transaction, in one round trip
(``SqlStore._one_statement``).
Reads use SQLAlchemy on both.

Validation happens before the batch writes anything. The store remembers the tail of every log
it has written recently (next ``seq``, ended or not); a submission whose ``expected_seq`` is
not next, or that follows a terminal event, fails with ``ConcurrencyError`` without touching
the database, and the rest of the batch goes ahead. Responses it does not know (another
replica wrote them, or they fell out of the cache) are looked up in the batch's transaction.

The unique key ``(response_id, seq)`` is the last word between replicas: a batch that hits a
constraint (or data the database refuses) is rolled back and its submissions are retried one
per transaction against fresh state from the database, so only the offending submission fails
and the others commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import logging
import re
import secrets
import sqlite3
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import asyncpg
from sqlalchemy import (
    Integer,
    Text,
    bindparam,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.conversations import ConversationStore
from persistence.database import (
    Generations,
    Synchronous,
    async_url,
    create_engine,
    needs_snapshot,
    sqlite_path,
)
from persistence.errors import (
    ConcurrencyError,
    Fenced,
    NotFound,
    RefusedWrite,
    StoreError,
    StoreUnavailable,
)
from persistence.group_commit import GroupCommit, Outcome
from persistence.health import StoreHealth, describe, is_unavailable
from persistence.item_index import IndexRow, LocatedItem, input_rows, output_row, pick
from persistence.lifecycle import (
    LIFECYCLE_EVENT_TYPES,
    OUTPUT_ITEM_DONE,
    TERMINAL_EVENT_TYPES,
    UNFINISHED_STATUSES,
    RowUpdate,
    initial_status,
    row_update,
)
from persistence.listing import ResponseQuery, sql_filters
from persistence.migrate import current_async, head_revision, upgrade_async
from persistence.records import (
    ApiKeyRow,
    AuditRecord,
    ChainLink,
    JsonObject,
    NewResponse,
    Replica,
    ResponseRow,
    StoredEvent,
    check_encodable,
    dump_json,
    item_id,
    pack_token_ids,
    unpack_token_ids,
)
from persistence.schema import (
    api_keys,
    item_index,
    response_audit,
    response_events,
    response_input_items,
    responses,
    server_secrets,
)
from persistence.schema import replicas as replicas_table
from persistence.sqlite_writer import SqliteWriter
from persistence.store import REPLICAS_CHANNEL, Completion, Done, Order, check_submission

if TYPE_CHECKING:
    from persistence.doorbell import Doorbell

__all__ = ["CommitStats", "SqlStore", "open_store"]

#: (the ``status`` index answers these, see ``persistence.lifecycle.UNFINISHED_STATUSES``)
_UNFINISHED = sorted(UNFINISHED_STATUSES)

#: The same, as SQL text (the names are constants, no quote in them).
_UNFINISHED_SQL = "status IN ({})".format(", ".join(f"'{status}'" for status in _UNFINISHED))

_log = logging.getLogger(__name__)

# What each driver raises when a constraint is violated (another writer got there first); any
# other failure is either the database being unavailable (``persistence.health.is_unavailable``:
# retried) or the data being refused (that submission fails alone).
_CONSTRAINT = (IntegrityError, sqlite3.IntegrityError, asyncpg.IntegrityConstraintViolationError)
#: PostgreSQL: a statement's rows go in with ``COPY`` from this many on (two round trips, the
#: cheapest per row), fewer with one ``executemany`` (one round trip; a new response's row, its
#: input items, audit records and item index entries are a few rows each).
_COPY_MIN_ROWS = 32
#: PostgreSQL: a commit of this replica's own logs (``SqlStore._one_statement``) is one
#: statement while its values (each column one text, ``_column_value``) take up to this many
#: bytes (characters) together: PostgreSQL refuses a text of 1 GB, and a message that large
#: would hold the connection's buffers; a larger batch goes as ``COPY``, which streams. Any
#: number of rows: the statement's ``unnest`` costs the database 2-5 µs a row more than
#: ``COPY``, but ``COPY`` takes three round trips more, each of which waits for a busy event
#: loop to come round (a turn of 256 unpaced streams is 40-60 ms). Measured side by side in the
#: twenty-first session against the twelfth's limit of 1,024 rows (bench/RESULTS.md): 256 paced
#: streams' p99 halved (the boundaries' big commits), unpaced tokens/s within noise.
_ONE_STATEMENT_MAX_BYTES = 64 << 20
#: A replica id that may go into SQL text as it is (``SqlStore._begin``).
_PLAIN_ID = re.compile(r"[A-Za-z0-9_]{1,64}")
# First pause between retries of a commit the database did not take, doubled up to the cap.
_RETRY_FIRST_S = 0.05
_RETRY_CAP_S = 1.0

# A chain longer than this is treated as a cycle (previous_response_id is never edited, so a
# real cycle cannot be written through the API, but a hand-edited database could hold one).
_MAX_CHAIN = 100_000
#: Logs read by one SQLite statement of ``load_after`` (see there).
_SQLITE_TAIL_BATCH = 200
#: The most values one statement's ``IN`` list takes: asyncpg refuses a statement of more than
#: 32,767 arguments, SQLite one of more than 32,766 variables, and a request can name more ids
#: than that (its item references, a conversation's new items): such a list is read in parts.
_IN_PART = 10_000


def _parts(values: Sequence[Any], size: int = _IN_PART) -> list[Sequence[Any]]:
    """``values`` in consecutive parts of at most ``size`` (none if it is empty)."""
    return [values[i : i + size] for i in range(0, len(values), size)]


async def open_store(
    database_url: str,
    *,
    commit_window_ms: float = 0.0,
    max_batch_events: int = 1024,
    sqlite_synchronous: Synchronous = "FULL",
    busy_timeout_ms: int = 5000,
    pool_size: int = 5,
    migrate: bool = True,
    retry_s: float = 20.0,
    statement_timeout_s: float = 5.0,
) -> SqlStore:
    """Open (creating and migrating to head unless ``migrate=False``) the store at
    ``database_url``: ``sqlite+aiosqlite:///path.db`` or ``postgresql+asyncpg://...``
    (plain ``sqlite://`` and ``postgresql://`` URLs get the async driver).

    ``retry_s``: how long a commit the database does not take (unreachable, frozen, read-only,
    full, locked) is retried before its writers get ``StoreUnavailable``; ``statement_timeout_s``:
    the longest any statement or commit may take (PostgreSQL: client and server side).

    A database that is at the newest revision but cannot be written (read-only, full) opens in
    degraded mode: reads work, ``health`` says why writes do not, and it recovers by itself."""
    if commit_window_ms < 0 or max_batch_events < 1:
        raise ValueError("commit_window_ms must be >= 0 and max_batch_events >= 1")
    if statement_timeout_s <= 0:
        raise ValueError("statement_timeout_s must be > 0")
    degraded: BaseException | None = None
    path = sqlite_path(async_url(database_url))
    read_only = path is not None and needs_snapshot(path)
    if read_only:
        degraded = await _open_read_only(database_url)
    elif migrate:
        degraded = await _migrate_or_degrade(database_url)
    options: dict[str, Any] = {
        "synchronous": sqlite_synchronous,
        "busy_timeout_ms": busy_timeout_ms,
        "pool_size": pool_size,
        "statement_timeout_s": statement_timeout_s,
    }
    writer = create_engine(database_url, role="writer", **options)
    is_sqlite = path is not None
    reader_role: Any = "snapshot" if read_only else "reader"
    reader = create_engine(database_url, role=reader_role, **options) if is_sqlite else writer
    # Connect once now: a database that cannot be reached fails the start, not the first
    # request, and SQLite is switched to WAL before anyone reads.
    try:
        async with (reader if read_only else writer).connect():
            pass
    except (SQLAlchemyError, OSError) as exc:
        await writer.dispose()
        await reader.dispose()
        raise _store_error(exc) from exc
    direct = (
        None
        if path is None
        else SqliteWriter(path, synchronous=sqlite_synchronous, busy_timeout_ms=busy_timeout_ms)
    )
    store = SqlStore(
        writer,
        reader,
        commit_window_ms=commit_window_ms,
        max_batch_events=max_batch_events,
        direct=direct,
        retry_s=retry_s,
        statement_timeout_s=statement_timeout_s,
        reopen_reader=(
            (lambda: create_engine(database_url, role="reader", **options)) if read_only else None
        ),
    )
    if degraded is not None:
        store.health.failed(degraded)
    return store


async def _open_read_only(database_url: str) -> BaseException:
    """A SQLite file on a read-only filesystem: readable (as a snapshot) if it is at head."""
    revision = await current_async(database_url, snapshot=True)
    if revision != head_revision():
        raise StoreUnavailable(
            f"the database is at revision {revision!r}, needs {head_revision()!r}, and its "
            "filesystem is read-only"
        )
    _log.warning("the database's filesystem is read-only: starting degraded (reads only)")
    return OSError(errno.EROFS, "the database's filesystem is read-only")


async def _migrate_or_degrade(database_url: str) -> BaseException | None:
    """Migrate to head; if the database cannot be written but is already at head, return why
    (the store opens degraded) instead of failing the start."""
    try:
        await upgrade_async(database_url)
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        try:
            revision = await current_async(database_url)
        except Exception:
            raise exc from None
        if revision != head_revision():
            raise StoreUnavailable(
                f"the database is at revision {revision!r}, needs {head_revision()!r}, and "
                f"cannot be migrated now ({describe(exc)})"
            ) from exc
        _log.warning("the database cannot be written (%s): starting degraded", describe(exc))
        return exc
    return None


@dataclass(frozen=True, slots=True)
class CommitStats:
    """Totals since the store opened: how well group commit is batching."""

    transactions: int  # write transactions committed
    writes: int  # creates, appends and audit appends committed
    events: int  # events committed


class _Tail(NamedTuple):
    """What the writer must know about a log: the next seq and whether it has ended."""

    next_seq: int
    ended: bool


_new_tail = tuple.__new__


# The queued writes. Not frozen: one is made per submission (per token when an engine paces its
# tokens), and a frozen dataclass's __init__ costs about twice as much.
@dataclass(slots=True, eq=False)
class _Create:
    response_id: str
    row: tuple[Any, ...]
    owner: str | None
    items: list[tuple[Any, ...]]
    index: list[IndexRow]  # the input items' rows of ``item_index``
    future: asyncio.Future[None]


@dataclass(slots=True, eq=False)
class _Append:
    response_id: str
    expected_seq: int
    rows: list[tuple[Any, ...]]
    ends: bool
    update: tuple[Any, ...] | None  # the responses row change, ready for the UPDATE
    future: Outcome  # an asyncio future, or the Completion of a submit_then
    index: list[IndexRow] | None  # output items finished by these events (``item_index``)


@dataclass(slots=True, eq=False)
class _Audit:
    response_id: str
    rows: list[tuple[Any, ...]]
    future: asyncio.Future[None]


_Write = _Create | _Append | _Audit


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one transaction writes: each write's refusal (or None), the statements, and how
    many events they hold."""

    outcomes: list[StoreError | None]
    statements: list[tuple[_Statement, list[tuple[Any, ...]]]]
    events: int


def _found_tails(
    tails: dict[str, _Tail | None], unknown: list[str], rows: Iterable[Sequence[Any]]
) -> None:
    """Fill ``tails`` for the ``unknown`` ids from (id, last_seq, last_type) rows."""
    found = {
        rid: _Tail(last_seq + 1, last_type in TERMINAL_EVENT_TYPES)
        for rid, last_seq, last_type in rows
    }
    for rid in unknown:
        tails[rid] = found.get(rid)


#: The event types whose append does more than add its row: a lifecycle event changes the
#: responses row (and a terminal one ends the log), an item's ``.done`` adds to the item index.
_ROW_EVENT_TYPES = LIFECYCLE_EVENT_TYPES | {OUTPUT_ITEM_DONE}


class SqlStore:
    """Use ``open_store`` to make one. ``reader`` may be ``writer`` (PostgreSQL)."""

    def __init__(
        self,
        writer: AsyncEngine,
        reader: AsyncEngine,
        *,
        commit_window_ms: float = 0.0,
        max_batch_events: int = 1024,
        tail_cache_size: int = 65_536,
        clock: Callable[[], float] = time.time,
        direct: SqliteWriter | None = None,
        retry_s: float = 20.0,
        statement_timeout_s: float = 5.0,
        reopen_reader: Callable[[], AsyncEngine] | None = None,
    ) -> None:
        self._postgres = writer.dialect.name == "postgresql"
        # SQLite: which connections a read-only disk left behind (see ``probe``)
        self._generations = None if self._postgres else Generations()
        self._writer = self._watch(writer)
        self._reader = self._watch(reader)
        # SQLite: group commits go through this writer thread, not through ``writer``
        self._direct = direct
        # PostgreSQL: the commit task's connection, kept from one commit to the next (a checkout
        # from the pool and its check-in cost 72-104 µs of CPU, a commit every engine step);
        # dropped, and the next commit checks out another, whenever it is lost or in doubt. With
        # it, its asyncpg connection (SQLAlchemy's ``get_raw_connection`` is a greenlet's switch
        # there and back, 35 us of CPU a commit).
        self._held: AsyncConnection | None = None
        self._held_raw: Any = None
        self._clock = clock
        self._sql = _Statements(postgres=self._postgres)
        self._tails: OrderedDict[str, _Tail] = OrderedDict()
        self._tail_cache_size = tail_cache_size
        self._commits: GroupCommit[_Write] = GroupCommit(
            self._commit, window_s=commit_window_ms / 1000, max_batch=max_batch_events
        )
        self._closed = False
        self._stats = CommitStats(0, 0, 0)
        self._statement_timeout_s = statement_timeout_s
        #: Whether writes work now (see ``persistence.health``); read by /health and the service.
        self.health = StoreHealth(retry_s)
        # The plan of the last transaction attempted, for a retry to recognise it in the log.
        self._last_plan: _Plan | None = None
        # Opened on a read-only filesystem: readers see a snapshot until writes work again.
        self._reopen_reader = reopen_reader
        # The replica whose lease ``probe`` renews, and for how long (``lease``).
        self._replica: tuple[Replica, float] | None = None
        # The epoch this store claimed for each response it took over (``claim``); a response it
        # created has epoch 0 and no entry. PostgreSQL appends are fenced by it.
        self._epochs: dict[str, int] = {}
        # The append fence's shortcut (PostgreSQL, with a lease): for each log of this replica,
        # the replica row's ``fence`` when its epoch was last seen to be this store's. A claim or
        # delete of one of the replica's responses bumps ``fence``, so while a commit reads the
        # same value under its share lock, none of these logs was claimed or deleted since.
        self._fenced_at: dict[str, int] = {}
        # That row's ``fence`` as a commit last read it (None: not read yet, or no row then):
        # the next commit's BEGIN locks the row in the same round trip if it still holds it.
        self._own_fence: int | None = None
        # ``_begin``'s statement up to that value (None: no lease, or an id not fit for SQL text).
        self._own_lock: str | None = None
        #: Logs whose epoch a commit checked row by row (the fence's slow path), since opening.
        self.fence_row_checks = 0
        #: Commits that were one statement (``_one_statement``), since opening.
        self.one_trip_commits = 0
        # Whether this lease's first heartbeat rang ``REPLICAS`` (see ``probe``).
        self._announced = False
        #: Rung (``persistence.doorbell``) for every response whose events a commit made durable,
        #: after the commit, so followers on other replicas read them at once.
        self.doorbell: Doorbell | None = None
        #: Called after every committed transaction with its events and the time it was done
        #: (``time.monotonic``), and the time its batch's first write was queued (``app.metrics``),
        #: on the event loop's thread, before its writers are told.
        self.commit_observer: Callable[[int, float, float], None] | None = None
        #: Totals since the store opened: commit attempts that failed, and those retried.
        self.commit_errors = 0
        self.commit_retries = 0

    def _watch(self, engine: AsyncEngine) -> AsyncEngine:
        return engine if self._generations is None else self._generations.watch(engine)

    @property
    def stats(self) -> CommitStats:
        return self._stats

    @functools.cached_property
    def conversations(self) -> ConversationStore:
        """Conversations and their item logs (``persistence.sql_conversations``)."""
        from persistence.sql_conversations import SqlConversations  # it imports this module

        return SqlConversations(
            self._writer, self._read, clock=self._clock, check_open=self._check_open
        )

    # -- writes -------------------------------------------------------------------------

    async def create_response(self, new: NewResponse) -> None:
        await self.submit_create(new)

    def submit_create(self, new: NewResponse) -> asyncio.Future[None]:
        self._check_open()
        row = (
            new.id,
            new.model,
            initial_status(new.background),
            new.created_at,
            new.previous_response_id,
            new.background,
            dump_json(new.request),
            new.project,
            new.api_key_id,
            new.owner,
        )
        items = [
            (new.id, position, item_id(item, position), dump_json(item))
            for position, item in enumerate(new.input_items)
        ]
        index = input_rows(new.id, new.input_items)
        future = asyncio.get_running_loop().create_future()
        self._commits.put(
            _Create(new.id, row, new.owner, items, index, future), weight=1 + len(items)
        )
        return future

    def submit(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        token_ids: Sequence[int] = (),
    ) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        self._queue_append(response_id, events, expected_seq, future, token_ids)
        return future

    def submit_then(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        done: Done,
        token_ids: Sequence[int] = (),
    ) -> None:
        self._check_open()
        if len(events) == 1 and expected_seq >= 0:
            # The per-token path of a paced engine (a live response's ``LogWriter``): one event a
            # response a commit, nearly always a delta, which touches neither the responses row
            # nor the item index. ``_queue_append`` makes the same row in 3.6-3.8 us; this in
            # 1.8-1.9 us, and in one call.
            event = events[0]
            type_ = event.type
            if event.seq == expected_seq and type_ not in _ROW_EVENT_TYPES:
                row = (
                    response_id,
                    expected_seq,
                    type_,
                    event.payload_text(),
                    self._clock(),
                    pack_token_ids(token_ids) if token_ids else None,
                )
                self._commits.put(
                    _Append(response_id, expected_seq, [row], False, None, Completion(done), None)
                )
                return
        self._queue_append(response_id, events, expected_seq, Completion(done), token_ids)

    def _queue_append(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        outcome: Outcome,
        token_ids: Sequence[int],
    ) -> None:
        self._check_open()
        check_submission(events, expected_seq)
        recorded_at = self._clock()
        rows: list[tuple[Any, ...]] = [
            (response_id, e.seq, e.type, e.payload_text(), recorded_at, None) for e in events
        ]
        if token_ids:  # on the write's last event: durable with the events they produced
            last = rows[-1]
            rows[-1] = (*last[:5], pack_token_ids(token_ids))
        update: RowUpdate | None = None
        index: list[IndexRow] | None = None
        for event, row in zip(events, rows, strict=True):
            if event.type not in _ROW_EVENT_TYPES:  # a delta, nearly always: only its row
                continue
            if event.type == OUTPUT_ITEM_DONE:  # the one kind of event the item index records
                located = output_row(response_id, event)
                if located is not None:
                    index = [located] if index is None else [*index, located]
                continue
            change = row_update(event)
            if change is not None:
                # a Response snapshot echoes the request (metadata, tools, instructions): the
                # one kind of event text that can carry what a request carried
                check_encodable(row[3])
                update = change
        write = _Append(
            response_id,
            expected_seq,
            rows,
            events[-1].type in TERMINAL_EVENT_TYPES,
            None if update is None else (*update.values(), response_id),
            outcome,
            index,
        )
        self._commits.put(write, weight=len(rows))

    async def append(
        self, response_id: str, events: Sequence[StoredEvent], expected_seq: int
    ) -> None:
        await self.submit(response_id, events, expected_seq)

    async def append_audit(self, response_id: str, records: Sequence[AuditRecord]) -> None:
        await self.submit_audit(response_id, records)

    def submit_audit(
        self, response_id: str, records: Sequence[AuditRecord]
    ) -> asyncio.Future[None]:
        self._check_open()
        recorded_at = self._clock()
        rows = []
        for record in records:
            packed = pack_token_ids(record.token_ids)
            detail = None if record.detail is None else dump_json(record.detail)
            rows.append((response_id, record.kind, len(packed) // 4, packed, detail, recorded_at))
        future = asyncio.get_running_loop().create_future()
        self._commits.put(_Audit(response_id, rows, future), weight=max(len(rows), 1))
        return future

    async def delete(self, response_id: str) -> bool:
        self._check_open()
        if not _possible_id(response_id):
            return False
        async with _store_errors(), self._writer.begin() as conn:
            # Its owner's fence first (an owner still appending to it then finds no row), in the
            # order its owner's commits lock them: the replica's row, then the response's.
            owner = select(responses.c.owner).where(responses.c.id == response_id).scalar_subquery()
            await conn.execute(_bump_fence(owner))
            # Events, audit records and input items go with the row (ON DELETE CASCADE); the
            # append-only trigger lets an event row go only once its response row is gone.
            result = await conn.execute(delete(responses).where(responses.c.id == response_id))
        self._tails.pop(response_id, None)
        return bool(result.rowcount)

    async def get_or_create_secret(self, name: str, factory: Callable[[], bytes]) -> bytes:
        self._check_open()
        find = select(server_secrets.c.value).where(server_secrets.c.name == name)
        async with self._read() as conn:  # a read first: a read-only database has its key
            found = (await conn.execute(find)).scalar_one_or_none()
        if found is not None:
            return bytes(found)
        async with _store_errors(), self._writer.begin() as conn:
            value = (await conn.execute(find)).scalar_one_or_none()
            if value is None:
                dialect_insert = postgresql.insert if self._postgres else sqlite.insert
                await conn.execute(
                    dialect_insert(server_secrets)
                    .values(name=name, value=bytes(factory()), created_at=self._clock())
                    .on_conflict_do_nothing(index_elements=["name"])
                )
                value = (await conn.execute(find)).scalar_one()
        return bytes(value)

    async def probe(self) -> None:
        """Try a real write (rewrite the reasoning key's row in place, the same bytes: it
        needs the write lock, a writable file and room in the WAL) and record the outcome in
        ``health``. Raises nothing: what it found is in ``health``."""
        self._check_open()
        touch = "UPDATE server_secrets SET created_at = created_at WHERE name = 'reasoning_key'"
        args: tuple[Any, ...] = ()
        if self._replica is not None:  # the probe is the heartbeat: renew the lease
            replica, lease_s = self._replica
            now = self._clock()
            touch = self._sql.upsert_replica
            fence = secrets.randbits(62)  # only if this inserts the row (see upsert_replica)
            args = (
                replica.id,
                replica.host,
                replica.pid,
                replica.started_at,
                now,
                now + lease_s,
                fence,
            )
        try:
            async with asyncio.timeout(self._statement_timeout_s):
                if self._direct is not None:
                    await self._direct.transaction(lambda conn: conn.execute(touch, args))
                else:
                    async with self._writer.connect() as conn:
                        raw = (await conn.get_raw_connection()).driver_connection
                        assert raw is not None
                        try:
                            async with raw.transaction():
                                await raw.execute(touch, *args)
                        except BaseException:
                            with contextlib.suppress(Exception):
                                await conn.invalidate()
                            raise
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self.health.failed(exc)
            if self._postgres:
                await self._reset_connections()
            elif "readonly" in describe(exc).lower() and self._generations is not None:
                # SQLite shares one ``-shm`` mapping among a process's connections to a file; if
                # they opened it while the file could not be written it stays read-only for
                # every new one, the writer's too, until all of them are closed (a read in
                # progress now: as soon as it ends)
                await self._generations.close_all(self._reader, self._writer)
            return
        if self._replica is not None and not self._announced and self.doorbell is not None:
            # the lease's first row: the other replicas sweep at once and learn of this one
            # (one that thought itself alone rings its commits for other processes again)
            self._announced = True
            self.doorbell.ring(REPLICAS_CHANNEL)
        if self._reopen_reader is not None:  # writable again: read what gets written now
            snapshot, self._reader = self._reader, self._watch(self._reopen_reader())
            self._reopen_reader = None
            await snapshot.dispose()
        self.health.succeeded()

    async def close(self) -> None:
        """Commit what is queued, then release the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._commits.close()
        finally:
            if self._direct is not None:
                await self._direct.close()
            await self._drop_held(invalidate=False)
            await self._writer.dispose()
            if self._reader is not self._writer:
                await self._reader.dispose()

    # -- group commit -------------------------------------------------------------------

    async def _commit(self, batch: list[_Write]) -> None:
        """Commit ``batch`` and settle every write. A batch whose data the database refuses is
        split until the culprit is alone, so one bad submission fails by itself and every
        other write of the batch commits; a database that is unavailable is retried (see
        ``_write_retrying``)."""
        result = await self._write_retrying(batch)
        if isinstance(result, BaseException):
            if len(batch) == 1:
                _settle(batch[0], _refusal(batch[0].response_id, result))
                return
            # Halves, not singles: a 1,000-write batch with one bad row costs ~20 transactions.
            middle = len(batch) // 2
            await self._commit(batch[:middle])
            await self._commit(batch[middle:])
            return
        appended: list[str] = []
        for write, outcome in zip(batch, result, strict=True):
            _settle(write, outcome)
            if outcome is None and type(write) is _Append:
                if write.ends:
                    self._epochs.pop(write.response_id, None)
                    self._fenced_at.pop(write.response_id, None)
                appended.append(write.response_id)
            elif outcome is not None:
                self._fenced_at.pop(write.response_id, None)
        bell = self.doorbell
        if bell is not None and appended:  # after the commit, never inside it
            bell.ring_all(appended)

    async def _write_retrying(self, batch: list[_Write]) -> list[StoreError | None] | BaseException:
        """Each write's outcome, or the exception with which the database refused the batch's
        data. While the database is unavailable the batch is retried with backoff (the writers
        waiting on it stay paused, nothing is published) until the outage is ``retry_s`` old;
        then every write fails with ``StoreUnavailable``. A retry first looks at the log: a
        commit whose answer was lost may have gone through, and then nothing is written twice."""
        after_failure = False
        pause = _RETRY_FIRST_S
        # This batch's own limit: a probe that succeeds between attempts (a full disk can take
        # a small in-place write and still refuse the batch) must not restart its retry time.
        deadline: float | None = None
        while True:
            try:
                outcomes = await self._write(
                    batch, fresh=after_failure, after_failure=after_failure
                )
            except Exception as exc:
                self._forget(batch)
                self.commit_errors += 1
                if not is_unavailable(exc):
                    return exc
                left = self.health.failed(exc)
                now = time.monotonic()
                if deadline is None:
                    deadline = now + left
                left = min(left, deadline - now)
                if not after_failure:
                    _log.warning(
                        "commit failed (%s); retrying for up to %.1f s", describe(exc), max(left, 0)
                    )
                if isinstance(exc, asyncpg.InterfaceError | OSError) or _connection_lost(exc):
                    await self._reset_connections()
                if left <= 0:
                    error = StoreUnavailable(self.health.reason or describe(exc))
                    error.__cause__ = exc
                    return [error] * len(batch)
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, _RETRY_CAP_S)
                after_failure = True
                self.commit_retries += 1
                continue
            if after_failure:
                _log.warning("commit succeeded again after the database was unavailable")
            self.health.succeeded()
            return outcomes

    async def _reset_connections(self) -> None:
        """Drop pooled connections after a lost one: after a database restart every pooled
        connection is dead, and each retry would otherwise find the next dead one."""
        if self._postgres:
            await self._drop_held(invalidate=True)
            with contextlib.suppress(Exception):
                await self._writer.dispose()

    async def _drop_held(self, *, invalidate: bool) -> None:
        """Let the commit task's connection go: back to the pool (``invalidate`` False: it is
        clean), or closed for good (lost, or in doubt)."""
        conn, self._held, self._held_raw = self._held, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await (conn.invalidate() if invalidate else conn.close())

    async def _write(
        self, batch: list[_Write], *, fresh: bool, after_failure: bool = False
    ) -> list[StoreError | None]:
        """Write ``batch`` in one transaction; return each write's refusal (or None).

        ``after_failure``: the previous attempt at this batch failed and may have committed
        anyway (its answer lost with the connection, or it timed out). If the fresh tails show
        any of its writes in the log, the whole transaction did commit: nothing is written again
        and the previous attempt's outcomes stand. (One writer per response makes that sound: no
        other process appends to these logs.)"""
        tails, unknown = self._cached_tails(batch, fresh=fresh)
        previous = self._last_plan if after_failure else None
        self._last_plan = None
        plan: _Plan
        try:
            async with asyncio.timeout(self._statement_timeout_s):
                if self._direct is not None:
                    plan = await self._direct.transaction(
                        functools.partial(self._write_direct, batch, tails, unknown, previous)
                    )
                else:
                    if self._held_raw is None:
                        await self._hold()
                    plan = await self._write_postgres(
                        self._held_raw, batch, tails, unknown, previous
                    )
        except TimeoutError as exc:
            if str(exc):
                raise
            raise TimeoutError(
                f"the database did not commit within {self._statement_timeout_s:g} s"
            ) from None
        self._stats = CommitStats(
            self._stats.transactions + 1,
            self._stats.writes + plan.outcomes.count(None),
            self._stats.events + plan.events,
        )
        if self.commit_observer is not None:
            self.commit_observer(plan.events, self._commits.batch_first_at, time.monotonic())
        cache = self._tails
        for rid, tail in tails.items():  # the newest tails are kept, up to the cache's size
            if tail is not None:
                cache[rid] = tail
                cache.move_to_end(rid)
        while len(cache) > self._tail_cache_size:
            cache.popitem(last=False)
        return plan.outcomes

    async def _hold(self) -> None:
        """Check out the connection the commit task keeps (``_held``), and its asyncpg one."""
        held = self._held = await self._writer.connect()
        try:
            raw = (await held.get_raw_connection()).driver_connection
        except BaseException:
            await self._drop_held(invalidate=True)  # closed under us: the next gets another
            raise
        assert raw is not None  # a live pooled connection
        self._held_raw = raw

    async def _write_postgres(
        self,
        raw: Any,
        batch: list[_Write],
        tails: dict[str, _Tail | None],
        unknown: list[str],
        previous: _Plan | None,
    ) -> _Plan:
        """``_write``'s transaction on PostgreSQL, on the asyncpg connection itself (SQLAlchemy
        never starts a transaction on the pooled connection, so it has nothing to roll back when
        that goes back to the pool). ``raw`` is the commit task's (``_held_raw``): a failure
        that leaves it unusable or in doubt drops it."""
        earned: dict[str, int] = {}
        try:
            if previous is None and not unknown:
                alone = await self._one_statement(raw, batch, tails)
                if alone is not None:
                    return alone
            own_fence = await self._begin(raw)
            if unknown:
                _found_tails(
                    tails, unknown, await raw.fetch(self._sql.tails(len(unknown)), *unknown)
                )
            if previous is not None and _committed_before(batch, tails, previous):
                plan = _Plan(previous.outcomes, [], 0)
            else:
                # one pass, by exact type (the batch holds a write a paced token)
                created: dict[str, str | None] = {}
                logs: dict[str, None] = {}
                for w in batch:
                    if type(w) is _Append:
                        logs[w.response_id] = None
                    elif type(w) is _Create:
                        created[w.response_id] = w.owner
                appended = [rid for rid in logs if rid not in created] if created else list(logs)
                epochs, earned = await self._fence(raw, appended, created, own_fence)
                plan = self._last_plan = self._plan(batch, tails, epochs)
                for statement, rows in plan.statements:
                    if statement.columns and len(rows) >= _COPY_MIN_ROWS:
                        await raw.copy_records_to_table(
                            statement.table, records=rows, columns=statement.columns
                        )
                    else:
                        await raw.executemany(statement.sql, rows)
            await raw.execute("COMMIT")
        except BaseException as exc:
            lost = isinstance(exc, asyncpg.InterfaceError | OSError | asyncio.CancelledError)
            if raw.is_closed() or lost or is_unavailable(exc):
                await self._drop_held(invalidate=True)  # unusable or in doubt: not again
            elif raw.is_in_transaction():  # e.g. a row the database refused: kept, clean
                try:
                    await raw.execute("ROLLBACK")
                except Exception:
                    await self._drop_held(invalidate=True)
            raise
        self._fenced_at.update(earned)  # committed: the new logs exist, the checks stand
        return plan

    async def _one_statement(
        self, raw: Any, batch: list[_Write], tails: dict[str, _Tail | None]
    ) -> _Plan | None:
        """A commit in one round trip instead of the full transaction's four to a dozen (BEGIN
        with the lock; each table's rows, one ``executemany`` or ``COPY``'s two; the UPDATE;
        COMMIT), each of which waits for a busy event loop to come round: when every log the
        batch appends to is one this replica last checked at its row's ``fence`` value
        (``_fence``'s shortcut for all of them) or one it creates in the batch, and the batch's
        values take no more than ``_ONE_STATEMENT_MAX_BYTES``, one statement, a transaction of its
        own, share-locks the row if ``fence`` still holds that value and only then writes every
        row (``_Statements.fenced``). Returns the plan it committed; None when the batch is not
        such a batch, or the fence moved (nothing was written: the full transaction follows
        and finds out why)."""
        seen, replica = self._own_fence, self._replica
        if seen is None or replica is None or self._own_lock is None:
            return None
        me = replica[0].id
        known = self._fenced_at
        created: set[str] = set()
        for write in batch:
            if isinstance(write, _Create):
                if write.owner != me:  # (a store's creates are its own; the long way says why not)
                    return None
                created.add(write.response_id)
                continue
            rid = write.response_id  # an audit record's log is not fenced (as in ``_fence``)
            if type(write) is _Append and known.get(rid) != seen and rid not in created:
                return None
        planned = dict(tails)  # (the plan advances them; kept only if the statement commits)
        # no epochs to check: every appended log's was this store's when the row held ``seen``
        # (as in ``_fence``'s shortcut) or is new, and the statement writes only while it holds
        plan = self._plan(batch, planned)
        if not plan.statements:  # every write refused: the full path says so
            return None
        sql, columns = self._sql.fenced(plan.statements)
        if sum(map(_value_size, columns)) > _ONE_STATEMENT_MAX_BYTES:
            return None  # (nothing was written: the full transaction plans it again)
        self._last_plan = plan  # (a retry after a lost answer looks for it in the log)
        if not await raw.fetchval(sql, me, seen, self._clock(), *columns):
            self._last_plan = None
            return None
        tails.update(planned)
        for write, outcome in zip(batch, plan.outcomes, strict=True):
            if outcome is None and type(write) is _Create:
                known[write.response_id] = seen  # a new log: nobody can have claimed it yet
        self.one_trip_commits += 1
        return plan

    async def _begin(self, raw: Any) -> int | None:
        """Begin ``_write_postgres``'s transaction. With a lease whose row's ``fence`` a commit
        has read before, the same round trip share-locks that row if its ``fence`` is still the
        value read (``_fence``'s shortcut, which then needs no query of its own): returns that
        value, or None when it moved, the row is gone or there is no lease (``_fence`` reads it).

        The values go into the SQL text (a simple query, the only kind that takes two
        statements): an integer, and a replica id only if it is plain letters, digits and ``_``
        (``app.leases`` makes them so); any other id takes the separate query."""
        seen, lock = self._own_fence, self._own_lock
        if seen is not None and lock is not None:
            status = await raw.execute(f"{lock}{int(seen)} FOR SHARE")
            return seen if status == "SELECT 1" else None
        await raw.execute("BEGIN")
        return None

    async def _fence(
        self, raw: Any, appended: list[str], created: dict[str, str | None], own_fence: int | None
    ) -> tuple[dict[str, int], dict[str, int]]:
        """The append fence, in the commit's transaction: each appended log's epoch, locked
        against a claim until this commits (a claim that comes after it sees these events; one
        before it fences them out). ``created``: the logs the commit creates, and their owners.
        Also the ``_fenced_at`` entries the commit earns (to keep once it commits).

        With a lease, the commit share-locks this replica's row first: a claim or delete of one
        of its responses bumps that row's ``fence`` in its own transaction, so it waits for this
        one, and one that came before shows in the value read. A log last checked at that value
        needs nothing more. Only the others (a log this store took over, a log after a claim or
        delete of any of its responses, every log without a lease) are read and locked row by
        row. ``own_fence``: the row's value, already locked and read when the transaction began
        (``_begin``); None: read it here."""
        earned: dict[str, int] = {}
        if not appended and not created:
            return {}, earned
        me: str | None = None
        fence: int | None = None
        if self._replica is not None:
            me = self._replica[0].id
            fence = own_fence
            if fence is None:
                fence = await raw.fetchval(
                    _OWN_FENCE, me
                )  # None: no row (not leased yet, released)
                self._own_fence = fence
        known = self._fenced_at
        epochs: dict[str, int] = {}
        unchecked: list[str] = []
        for rid in appended:
            if fence is not None and known.get(rid) == fence:
                epochs[rid] = self._epochs.get(rid, 0)  # unchanged: a claim bumps the fence
            else:
                unchecked.append(rid)
        if unchecked:
            self.fence_row_checks += len(unchecked)
            for rid, epoch, owner in await raw.fetch(_FENCE, unchecked):
                epochs[rid] = epoch
                if fence is not None and owner == me and epoch == self._epochs.get(rid, 0):
                    earned[rid] = fence
        for rid, owner in created.items():  # a new log: nobody can have claimed it yet
            epochs[rid] = 0
            if fence is not None and owner == me:
                earned[rid] = fence
        return epochs, earned

    def _write_direct(
        self,
        batch: list[_Write],
        tails: dict[str, _Tail | None],
        unknown: list[str],
        previous: _Plan | None,
        conn: sqlite3.Connection,
    ) -> _Plan:
        """``_write``'s transaction on the SQLite writer thread (see ``persistence.sqlite_writer``)."""
        if unknown:
            _found_tails(tails, unknown, conn.execute(self._sql.tails(len(unknown)), unknown))
        if previous is not None and _committed_before(batch, tails, previous):
            return _Plan(previous.outcomes, [], 0)
        plan = self._last_plan = self._plan(batch, tails)
        for statement, rows in plan.statements:
            conn.executemany(statement.sql, rows)
        return plan

    def _cached_tails(
        self, batch: list[_Write], *, fresh: bool
    ) -> tuple[dict[str, _Tail | None], list[str]]:
        """The tails of the logs the batch touches that the cache knows (none if ``fresh``),
        and the ids it does not know. A response the batch creates before anything else
        touches it has no log yet: no query (if its row exists after all, the insert fails and
        the writes are retried one by one, with ``fresh`` tails)."""
        tails: dict[str, _Tail | None] = {}
        unknown: list[str] = []
        for write in batch:
            rid = write.response_id
            if rid in tails or rid in unknown:
                continue
            known = None if fresh else self._tails.get(rid)
            if known is not None:
                tails[rid] = known
            elif isinstance(write, _Create) and not fresh:
                tails[rid] = None
            else:
                unknown.append(rid)
        return tails, unknown

    def _plan(
        self,
        batch: list[_Write],
        tails: dict[str, _Tail | None],
        epochs: dict[str, int] | None = None,
    ) -> _Plan:
        """Check every write against the tails (updating them) and, on PostgreSQL, every append
        against its log's epoch (``epochs``: id -> the row's epoch, read under a share lock;
        SQLite serves one process, which no other can take a response from), and gather the
        rows to write."""
        outcomes: list[StoreError | None] = []
        creates: list[tuple[Any, ...]] = []
        items: list[tuple[Any, ...]] = []
        index: list[IndexRow] = []
        events: list[tuple[Any, ...]] = []
        audits: list[tuple[Any, ...]] = []
        updates: dict[str, tuple[Any, ...]] = {}
        for write in batch:
            rid = write.response_id
            tail = tails[rid]
            if isinstance(write, _Create):
                if tail is not None:
                    outcomes.append(ConcurrencyError(f"response {rid!r} already exists"))
                    continue
                creates.append(write.row)
                items.extend(write.items)
                index.extend(write.index)
                tails[rid] = _Tail(0, False)
            elif tail is None:
                outcomes.append(NotFound(f"no response {rid!r}"))
                continue
            elif isinstance(write, _Audit):
                audits.extend(write.rows)
            elif tail.ended:
                outcomes.append(ConcurrencyError(f"the log of {rid!r} has ended"))
                continue
            elif epochs is not None and epochs.get(rid) != self._epochs.get(rid, 0):
                if rid not in epochs:  # deleted meanwhile (by another replica)
                    outcomes.append(NotFound(f"no response {rid!r}"))
                else:
                    outcomes.append(Fenced(f"response {rid!r} was taken over by another server"))
                continue
            elif write.expected_seq != tail.next_seq:
                outcomes.append(
                    ConcurrencyError(
                        f"response {rid!r}: expected_seq {write.expected_seq}, "
                        f"next seq is {tail.next_seq}"
                    )
                )
                continue
            else:
                events.extend(write.rows)
                if write.index is not None:
                    index.extend(write.index)
                # (``tuple.__new__``: a NamedTuple's own constructor is a Python call, once a token)
                tails[rid] = _new_tail(_Tail, (tail.next_seq + len(write.rows), write.ends))
                if write.update is not None:
                    updates[rid] = write.update
            outcomes.append(None)
        statements = [
            (statement, rows)
            for statement, rows in (
                (self._sql.insert_response, creates),
                (self._sql.insert_input_item, items),
                (self._sql.insert_item_index, index),
                (self._sql.insert_event, events),
                (self._sql.insert_audit, audits),
                (self._sql.update_response, list(updates.values())),
            )
            if rows
        ]
        return _Plan(outcomes, statements, len(events))

    def _forget(self, batch: Iterable[_Write]) -> None:
        for write in batch:
            self._tails.pop(write.response_id, None)

    # -- API keys -----------------------------------------------------------------------

    async def create_api_key(self, key: ApiKeyRow) -> None:
        self._check_open()
        try:
            async with _store_errors(), self._writer.begin() as conn:
                await conn.execute(api_keys.insert().values(**dataclasses.asdict(key)))
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                raise ConcurrencyError(f"API key {key.id!r} already exists") from None
            raise

    async def find_api_key(self, secret_hash: str) -> ApiKeyRow | None:
        self._check_open()
        query = select(*api_keys.c).where(api_keys.c.secret_hash == secret_hash)
        async with self._read() as conn:
            row = (await conn.execute(query)).one_or_none()
        return None if row is None else ApiKeyRow(**row._asdict())

    async def list_api_keys(self) -> list[ApiKeyRow]:
        self._check_open()
        query = select(*api_keys.c).order_by(
            api_keys.c.project, api_keys.c.created_at, api_keys.c.id
        )
        async with self._read() as conn:
            return [ApiKeyRow(**row._asdict()) for row in await conn.execute(query)]

    async def revoke_api_key(self, key_id: str) -> bool:
        self._check_open()
        if not _possible_id(key_id):
            return False
        update = (
            api_keys.update()
            .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=self._clock())
        )
        async with _store_errors(), self._writer.begin() as conn:
            result = await conn.execute(update)
        return bool(result.rowcount)

    # -- reads --------------------------------------------------------------------------

    async def load(
        self, response_id: str, after_seq: int | None = None, limit: int | None = None
    ) -> list[StoredEvent]:
        self._check_open()
        if not _possible_id(response_id):
            return []
        query = _EVENTS.where(response_events.c.response_id == response_id)
        if after_seq is not None:
            query = query.where(response_events.c.seq > after_seq)
        query = query.order_by(response_events.c.seq)
        if limit is not None:
            query = query.limit(limit)
        async with self._read() as conn:
            rows = await conn.execute(query)
            return [StoredEvent(seq, type_, None, text) for seq, type_, text in rows]

    async def load_times(self, response_id: str) -> list[tuple[int, str, float]]:
        """``(seq, type, recorded_at)`` of every event: when the server stored it (a one-statement
        commit's time, shared by its events; otherwise when its write was queued). No payloads:
        the audit page's timeline."""
        self._check_open()
        if not _possible_id(response_id):
            return []
        query = (
            select(_e.c.seq, _e.c.type, _e.c.recorded_at)
            .where(_e.c.response_id == response_id)
            .order_by(_e.c.seq)
        )
        async with self._read() as conn:
            return [(seq, type_, at) for seq, type_, at in await conn.execute(query)]

    async def list_responses(self, query: ResponseQuery) -> tuple[list[ResponseRow], bool]:
        """A page of the responses ``query`` selects, newest first, and whether more follow."""
        self._check_open()
        statement = (
            _ROWS.where(*sql_filters(query))
            .order_by(_r.c.created_at.desc(), _r.c.id.desc())
            .offset(query.offset)
            .limit(query.limit + 1)
        )
        async with self._read() as conn:
            rows = [_response_row(row) for row in await conn.execute(statement)]
        return rows[: query.limit], len(rows) > query.limit

    async def load_after(self, afters: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        """The events of several logs, each after its own seq, in one query (followers on this
        replica, woken together by the doorbell, read together)."""
        self._check_open()
        ids = [rid for rid in afters if _possible_id(rid)]
        found: dict[str, list[StoredEvent]] = {rid: [] for rid in ids}
        if not ids:
            return found
        e = response_events
        if self._postgres:
            # one primary-key range scan per log: a plain join of the unnest with the events is
            # planned as a hash join over a sequential scan of the whole table (EXPLAIN, 19,000
            # events), a cost that grows with the table
            queries: list[Any] = [
                _TAIL_READ.bindparams(ids=ids, afters=[afters[rid] for rid in ids])
            ]
        else:
            # one range of the key a log, OR-ed; SQLite parses a chain of ORs as a tree as deep
            # as it is long and refuses one over 1,000 deep ("Expression tree is too large"):
            # a batch of a thousand logs failed whole, and each follower then read alone
            queries = [
                select(e.c.response_id, e.c.seq, e.c.type, cast(e.c.payload, Text))
                .where(or_(*((e.c.response_id == rid) & (e.c.seq > afters[rid]) for rid in part)))
                .order_by(e.c.response_id, e.c.seq)
                for part in _parts(ids, _SQLITE_TAIL_BATCH)
            ]
        async with self._read() as conn:
            for query in queries:
                for rid, seq, type_, payload in await conn.execute(query):
                    found[rid].append(StoredEvent(seq, type_, None, payload))
        return found

    async def get(self, response_id: str) -> ResponseRow | None:
        self._check_open()
        if not _possible_id(response_id):
            return None
        async with self._read() as conn:
            row = (await conn.execute(_ROWS.where(responses.c.id == response_id))).one_or_none()
        return None if row is None else _response_row(row)

    async def load_chain(self, response_id: str, *, project: str | None = None) -> list[ChainLink]:
        self._check_open()
        if not _possible_id(response_id):
            raise NotFound(f"no response {response_id!r}")
        async with self._read(repeatable=True) as conn:
            chain = (await conn.execute(_CHAIN, {"start": response_id})).all()
            if len(chain) > _MAX_CHAIN:
                raise StoreError(f"the chain of {response_id!r} has a cycle")
            missing = [link.chain_id for link in chain if link.id is None]
            if missing:
                raise NotFound(f"no response {missing[0]!r} (in the chain of {response_id!r})")
            foreign = [link.id for link in chain if project is not None and link.project != project]
            if foreign:  # another project's response: as if it did not exist
                raise NotFound(f"no response {foreign[0]!r} (in the chain of {response_id!r})")
            ids = [link.id for link in chain]
            items: dict[str, list[JsonObject]] = {rid: [] for rid in ids}
            for part in _parts(ids):
                for rid, item in await conn.execute(_CHAIN_ITEMS, {"ids": part}):
                    items[rid].append(item)
            # an ended response's last event is its terminal one, whose snapshot holds the whole
            # output (read with the chain); only one still generating has its finished items
            # read one by one
            events: dict[str, list[StoredEvent]] = {rid: [] for rid in ids}
            generating = []
            for link in chain:
                if link.last_type in TERMINAL_EVENT_TYPES:
                    events[link.id].append(
                        StoredEvent(link.last_seq, link.last_type, None, link.last_payload)
                    )
                else:
                    generating.append(link.id)
            if generating:
                for part in _parts(generating):
                    for rid, seq, type_, text in await conn.execute(_CHAIN_EVENTS, {"ids": part}):
                        events[rid].append(StoredEvent(seq, type_, None, text))
        return [
            ChainLink(_response_row(link), items[link.id], events[link.id])
            for link in reversed(chain)
        ]

    async def load_audit(self, response_id: str) -> list[AuditRecord]:
        self._check_open()
        if not _possible_id(response_id):
            return []
        query = (
            select(response_audit.c.kind, response_audit.c.token_ids, response_audit.c.detail)
            .where(response_audit.c.response_id == response_id)
            .order_by(response_audit.c.id)
        )
        async with self._read() as conn:
            rows = await conn.execute(query)
            return [
                AuditRecord(kind, unpack_token_ids(bytes(token_ids)), detail)
                for kind, token_ids, detail in rows
            ]

    async def find_items(self, item_ids: Sequence[str], *, project: str) -> dict[str, LocatedItem]:
        """The stored items of ``project`` with these ids (``persistence.item_index``); an id
        that is missing, or another project's, is not in the answer."""
        self._check_open()
        ids = sorted({i for i in item_ids if _possible_id(i)})
        if not ids or not _possible_id(project):
            return {}
        rows = []
        async with self._read() as conn:
            for part in _parts(ids):
                rows += [
                    row
                    for row in await conn.execute(_FIND_ITEMS, {"ids": part})
                    if row[6] == project
                ]
        # by id, the output item first, then the newest response (``persistence.item_index``)
        rows.sort(key=lambda row: (row[0], row[2] != "output", -(row[7] or 0), row[1]))
        return pick(row[:6] for row in rows)

    async def list_input_items(
        self, response_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[JsonObject], bool]:
        self._check_open()
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if not _possible_id(response_id) or (after is not None and not _possible_id(after)):
            raise NotFound(f"no response {response_id!r}")
        table = response_input_items
        query = select(table.c.item).where(table.c.response_id == response_id)
        async with self._read() as conn:
            exists = select(responses.c.id).where(responses.c.id == response_id)
            if (await conn.execute(exists)).first() is None:
                raise NotFound(f"no response {response_id!r}")
            if after is not None:
                cursor = (
                    await conn.execute(
                        select(func.min(table.c.position)).where(
                            table.c.response_id == response_id, table.c.item_id == after
                        )
                    )
                ).scalar_one()
                if cursor is None:
                    raise NotFound(f"no input item {after!r} in response {response_id!r}")
                query = query.where(
                    table.c.position > cursor if order == "asc" else table.c.position < cursor
                )
            position = table.c.position.asc() if order == "asc" else table.c.position.desc()
            page = list((await conn.execute(query.order_by(position).limit(limit + 1))).scalars())
        return page[:limit], len(page) > limit

    async def unfinished(self, *, owned_by_others_than: Sequence[str] | None = None) -> list[str]:
        """Responses whose log has no terminal event, oldest first. With
        ``owned_by_others_than``: only those with no owner or an owner not in it (the live
        replicas: what is left is orphaned)."""
        self._check_open()
        owners = list(owned_by_others_than or ())  # (none: no one's rows are left out)
        query = text(
            f"SELECT id FROM {self._unfinished_rows} WHERE {_UNFINISHED_SQL}"
            + (" AND (owner IS NULL OR owner NOT IN :owners)" if owners else "")
            + " ORDER BY created_at, id"
        )
        if owners:
            query = query.bindparams(bindparam("owners", owners, expanding=True))
        async with self._read() as conn:
            return list((await conn.execute(query)).scalars())

    @property
    def _unfinished_rows(self) -> str:
        """``responses``, read by the periodic queries for unfinished responses (the orphan
        sweep, a replica's cancel requests) through its status index: a scan would cost each
        of them time in proportion to every response ever stored (bench/RESULTS.md). SQLite is
        told which index (``INDEXED BY``): once ``ANALYZE`` has run, its statistics say a
        status matches half the table (they keep no skew), and it would scan instead;
        PostgreSQL's keep the most common values and find the index by themselves."""
        return "responses" if self._postgres else "responses INDEXED BY ix_responses_status"

    # -- replicas -----------------------------------------------------------------------

    def lease(self, replica: Replica, lease_s: float) -> None:
        """From now on ``probe`` renews ``replica``'s lease for ``lease_s`` (the heartbeat)."""
        self._replica = (replica, lease_s)
        self._announced = False
        self._own_fence = None
        self._own_lock = (
            f"BEGIN; SELECT 1 FROM replicas WHERE id = '{replica.id}' AND fence = "
            if _PLAIN_ID.fullmatch(replica.id)
            else None
        )

    async def replicas(self) -> list[Replica]:
        """Every replica row, expired or not."""
        self._check_open()
        async with self._read() as conn:
            rows = await conn.execute(
                select(*replicas_table.c).order_by(replicas_table.c.started_at)
            )
            return [
                Replica(r.id, r.host, r.pid, r.started_at, r.heartbeat_at, r.expires_at)
                for r in rows
            ]

    async def release(self, replica_id: str) -> None:
        """Remove a replica's row: a clean shutdown, or a drain handing its responses to the
        others (the doorbell's ``REPLICAS`` channel tells them to sweep at once)."""
        self._check_open()
        async with _store_errors(), self._writer.begin() as conn:
            await conn.execute(delete(replicas_table).where(replicas_table.c.id == replica_id))
        if self.doorbell is not None:
            self.doorbell.ring(REPLICAS_CHANNEL)

    # -- takeover -----------------------------------------------------------------------

    async def claim(self, response_id: str, from_owner: str | None, to_owner: str) -> int | None:
        """Make ``to_owner`` the owner of an unfinished response that ``from_owner`` owned (the
        caller found it orphaned): its epoch goes up by one, which fences out every later
        append of the old owner. The new epoch, or None if the claim was lost (someone else
        claimed it first, or it ended, or it is gone): exactly one claimant wins."""
        self._check_open()
        if not _possible_id(response_id):
            return None
        r = responses
        query = (
            update(r)
            .where(
                r.c.id == response_id,
                r.c.owner.is_(None) if from_owner is None else r.c.owner == from_owner,
                r.c.status.in_(_UNFINISHED),
            )
            .values(owner=to_owner, epoch=r.c.epoch + 1)
            .returning(r.c.epoch)
        )
        try:
            async with _store_errors(), self._writer.begin() as conn:
                if self._postgres:  # a lock held by a frozen owner: not now, the next sweep
                    await conn.execute(text("SET LOCAL lock_timeout = '500ms'"))
                if from_owner is not None:  # first: the owner's commits lock this row first too
                    await conn.execute(_bump_fence(from_owner))
                epoch = (await conn.execute(query)).scalar_one_or_none()
        except StoreError as exc:
            if isinstance(exc.__cause__, DBAPIError) and "lock timeout" in str(exc.__cause__):
                _log.info(
                    "response %s: its row is locked (its owner froze mid-commit?); claim later",
                    response_id,
                )
                return None
            raise
        if epoch is None:
            return None
        self._epochs[response_id] = int(epoch)
        self._tails.pop(response_id, None)  # another process wrote it: read its tail afresh
        return int(epoch)

    async def output_tokens(self, response_id: str) -> list[int]:
        """The output token ids behind the logged events, in order."""
        return [token for write in await self.output_token_writes(response_id) for token in write]

    async def output_token_writes(self, response_id: str) -> list[list[int]]:
        """The output token ids of each append that carried some, in order (what a takeover
        replays: they are on each append's last event)."""
        self._check_open()
        if not _possible_id(response_id):
            return []
        e = response_events
        query = (
            select(e.c.token_ids)
            .where(e.c.response_id == response_id, e.c.token_ids.is_not(None))
            .order_by(e.c.seq)
        )
        async with self._read() as conn:
            return [
                list(unpack_token_ids(bytes(packed))) for (packed,) in await conn.execute(query)
            ]

    async def request_cancel(self, response_id: str) -> bool:
        """Record that a cancel was asked of an unfinished response (for its owner, elsewhere).
        False if it has ended or does not exist."""
        self._check_open()
        if not _possible_id(response_id):
            return False
        r = responses
        query = (
            update(r)
            .where(r.c.id == response_id, r.c.status.in_(_UNFINISHED))
            .values(cancel_requested_at=self._clock())
        )
        async with _store_errors(), self._writer.begin() as conn:
            result = await conn.execute(query)
        return bool(result.rowcount)

    async def cancel_requests(self, owner: str) -> list[str]:
        """The unfinished responses of ``owner`` that someone asked to cancel."""
        self._check_open()
        query = text(
            f"SELECT id FROM {self._unfinished_rows} WHERE owner = :owner"
            f" AND cancel_requested_at IS NOT NULL AND {_UNFINISHED_SQL}"
        ).bindparams(owner=owner)
        async with self._read() as conn:
            return list((await conn.execute(query)).scalars())

    @asynccontextmanager
    async def _read(self, *, repeatable: bool = False) -> AsyncIterator[AsyncConnection]:
        async with _store_errors(), self._reader.connect() as conn:
            if repeatable and self._postgres:
                await conn.execution_options(isolation_level="REPEATABLE READ")
            yield conn

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")


@dataclass(frozen=True, slots=True)
class _Statement:
    """A write statement; an insert also names its table and columns (PostgreSQL copies the
    rows in instead of running ``sql`` for each)."""

    sql: str
    table: str = ""
    columns: tuple[str, ...] = ()


class _Statements:
    """The write path's SQL in the driver's own placeholders (``$n`` for asyncpg, ``?`` for
    sqlite3), for ``executemany`` with tuples of parameters."""

    def __init__(self, *, postgres: bool) -> None:
        self._postgres = postgres

        def insert(table: str, columns: tuple[str, ...]) -> _Statement:
            marks = self._marks(len(columns))
            sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
            return _Statement(sql, table, columns)

        self.insert_response = insert(
            "responses",
            (
                "id",
                "model",
                "status",
                "created_at",
                "previous_response_id",
                "background",
                "request",
                "project",
                "api_key_id",
                "owner",
            ),
        )
        self.insert_input_item = insert(
            "response_input_items", ("response_id", "position", "item_id", "item")
        )
        self.insert_item_index = insert(
            "item_index", ("item_id", "response_id", "source", "position", "seq")
        )
        self.insert_event = insert(
            "response_events", ("response_id", "seq", "type", "payload", "recorded_at", "token_ids")
        )
        self.insert_audit = insert(
            "response_audit",
            ("response_id", "kind", "token_count", "token_ids", "detail", "recorded_at"),
        )
        # Columns in RowUpdate order, then the id.
        columns = [field.name for field in dataclasses.fields(RowUpdate)]
        sets = ", ".join(
            f"{name} = {f'${i}' if postgres else '?'}" for i, name in enumerate(columns, 1)
        )
        where = f"${len(columns) + 1}" if postgres else "?"
        self.update_response = _Statement(f"UPDATE responses SET {sets} WHERE id = {where}")
        self._update_columns = (*columns, "id")  # (its parameters' order)
        # The one-statement commit's insert of a new row: its first lifecycle change folded in
        # (a statement's parts cannot see each other's rows, so none can update a row it inserts).
        self.insert_changed_response = _Statement(
            "", "responses", (*self.insert_response.columns, *columns[1:])
        )
        self._status = self.insert_response.columns.index("status")
        assert columns[0] == "status"  # (a change's status replaces the new row's)
        self._fenced: dict[tuple[_Part, ...], str] = {}
        # A new row's ``fence`` starts at a random value, never at one its replica may have seen
        # before the row went (a drain removes it) and came back.
        self.upsert_replica = (
            f"INSERT INTO replicas (id, host, pid, started_at, heartbeat_at, expires_at, fence)"
            f" VALUES ({self._marks(7)}) ON CONFLICT (id) DO UPDATE SET"
            " heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at"
        )

    def fenced(
        self, statements: list[tuple[_Statement, list[tuple[Any, ...]]]]
    ) -> tuple[str, list[list[Any]]]:
        """A plan's statements as one (PostgreSQL, ``SqlStore._one_statement``), and its
        parameters after the replica's id, ``fence`` value and the commit's time: every row is
        written only while that row holds that value, share-locked until the statement's own
        transaction commits. Each table's rows are one parameter a column (``_column_value``),
        unnested, but for ``recorded_at``: every row's is the commit's time (one parameter, not
        a float's text a row: ``float.__repr__`` was 0.4 us a row, the largest part of a paced
        commit's parameters). A new row changed in the same batch is inserted changed. The
        statement returns 1 when it wrote, 0 when the fence moved."""
        parts = dict(statements)
        created = parts.pop(self.insert_response, None)
        changes = parts.pop(self.update_response, None)
        if created is not None:
            changed = {change[-1]: change for change in changes} if changes else {}
            status, later = (
                self._status,
                (None,) * (len(self.insert_changed_response.columns) - len(created[0])),
            )
            rows = []
            for row in created:
                change = changed.pop(row[0], None)
                if change is None:
                    rows.append((*row, *later))
                else:
                    rows.append((*row[:status], change[0], *row[status + 1 :], *change[1:-1]))
            parts = {self.insert_changed_response: rows, **parts}
            changes = list(changed.values())
        if changes:
            parts[self.update_response] = changes
        values: list[Any] = []
        shapes: list[_Part] = []
        for statement, rows in parts.items():
            updates = statement is self.update_response
            table, names = (
                ("responses", self._update_columns)
                if updates
                else (statement.table, statement.columns)
            )
            types, forms = _PG_TYPES[table], []
            for name, column in zip(names, zip(*rows, strict=True), strict=True):
                if name == "recorded_at":  # the commit's own time, one parameter for all
                    forms.append("now")
                    continue
                form, value = _column_value(types[name], column)
                forms.append(form)
                values.append(value)
            shapes.append(_Part(table, names, tuple(forms), updates))
        key = tuple(shapes)
        sql = self._fenced.get(key)
        if sql is None:
            sql = self._fenced[key] = _fenced_sql(key)
        return sql, values

    def _marks(self, count: int) -> str:
        return ", ".join(f"${i}" if self._postgres else "?" for i in range(1, count + 1))

    def tails(self, count: int) -> str:
        """The look-up of ``count`` logs the writer does not know: (id, last seq, last type)."""
        return _TAILS.format(marks=self._marks(count))


def _possible_id(ident: str) -> bool:
    """False for an id no row can have: PostgreSQL text cannot hold U+0000 (the driver would
    refuse the query), and a lone surrogate cannot be encoded at all."""
    if "\x00" in ident:
        return False
    try:
        ident.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _committed_before(batch: list[_Write], tails: dict[str, _Tail | None], previous: _Plan) -> bool:
    """Whether the log shows the previous attempt's transaction (its writes were planned
    against these same logs; a transaction commits whole, so one write found is all)."""
    for write, outcome in zip(batch, previous.outcomes, strict=True):
        if outcome is not None:
            continue  # refused in the plan: never in the transaction
        tail = tails.get(write.response_id)
        if tail is None:
            continue
        if isinstance(write, _Create):
            return True
        if isinstance(write, _Append) and write.expected_seq < tail.next_seq:
            return True
    return False


def _connection_lost(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None)
    return isinstance(orig, asyncpg.InterfaceError | asyncpg.PostgresConnectionError | OSError)


def _refusal(response_id: str, exc: BaseException) -> StoreError:
    """What a submission whose data the database refused fails with."""
    if isinstance(exc, _CONSTRAINT):
        return _integrity_error(response_id, exc)  # type: ignore[arg-type]
    error = RefusedWrite(
        f"response {response_id!r}: the database refused the data ({describe(exc)})"
    )
    error.__cause__ = exc
    return error


def _settle(write: _Write, outcome: StoreError | None) -> None:
    future = write.future
    if type(future) is Completion:  # a submit_then's (a paced token's): one call settles it
        future.settle(outcome)
        return
    if future.done():  # the caller cancelled its wait; the write stands regardless
        return
    if outcome is None:
        future.set_result(None)
    else:
        future.set_exception(outcome)


def _store_error(exc: BaseException) -> StoreError:
    error = (
        StoreUnavailable(describe(exc))
        if is_unavailable(exc)
        else StoreError(f"database error: {describe(exc)}")
    )
    error.__cause__ = exc
    return error


def _integrity_error(response_id: str, exc: Exception) -> StoreError:
    if "foreign key" in str(getattr(exc, "orig", exc)).lower():
        error: StoreError = NotFound(f"no response {response_id!r}")
    else:
        error = ConcurrencyError(f"response {response_id!r}: another writer got there first")
    error.__cause__ = exc
    return error


@asynccontextmanager
async def _store_errors() -> AsyncIterator[None]:
    try:
        yield
    except (
        SQLAlchemyError,
        OSError,
        sqlite3.Error,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
    ) as exc:
        raise _store_error(exc) from exc


def _response_row(row: Any) -> ResponseRow:
    return ResponseRow(
        id=row.id,
        model=row.model,
        status=row.status,
        created_at=row.created_at,
        completed_at=row.completed_at,
        previous_response_id=row.previous_response_id,
        background=bool(row.background),
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        reasoning_tokens=row.reasoning_tokens,
        error_code=row.error_code,
        incomplete_reason=row.incomplete_reason,
        request=row.request,
        last_seq=row.last_seq,
        project=row.project,
        api_key_id=row.api_key_id,
        owner=row.owner,
        epoch=row.epoch,
        cancel_requested_at=row.cancel_requested_at,
    )


# -- read queries (compiled once per dialect and cached by SQLAlchemy) ------------------------

_e = response_events
_r = responses

_LAST_SEQ = (
    select(func.coalesce(func.max(_e.c.seq), -1))
    .where(_e.c.response_id == _r.c.id)
    .scalar_subquery()
    .label("last_seq")
)
# The writers' look-up of logs they do not know, in plain SQL for sqlite3 and asyncpg ({marks}: one
# placeholder per id).
_TAILS = (
    "SELECT r.id,"
    " (SELECT coalesce(max(e.seq), -1) FROM response_events AS e WHERE e.response_id = r.id),"
    " (SELECT e.type FROM response_events AS e WHERE e.response_id = r.id"
    " ORDER BY e.seq DESC LIMIT 1)"
    " FROM responses AS r WHERE r.id IN ({marks})"
)
_ROWS = select(*_r.c, _LAST_SEQ)
# Followers' batched read (PostgreSQL): each log after its own seq, by its primary key.
_TAIL_READ = text(
    "SELECT f.id, e.seq, e.type, e.payload::text"
    " FROM unnest(CAST(:ids AS text[]), CAST(:afters AS integer[])) AS f(id, after)"
    " CROSS JOIN LATERAL (SELECT seq, type, payload FROM response_events"
    " WHERE response_id = f.id AND seq > f.after ORDER BY seq) AS e"
    " ORDER BY f.id, e.seq"
)
# The append fence (PostgreSQL): the epoch of each log a commit appends to, share-locked so that a
# concurrent claim (an UPDATE of the row) waits for the commit, and a commit after a claim sees it.
_FENCE = "SELECT id, epoch, owner FROM responses WHERE id = ANY($1::text[]) FOR SHARE"
# Its shortcut: this replica's own row, share-locked (see ``SqlStore._fence``).
_OWN_FENCE = "SELECT fence FROM replicas WHERE id = $1 FOR SHARE"
#: Each written column's PostgreSQL type, for the one-statement commit's arrays.
_PG_TYPES = {
    table.name: {
        column.name: column.type.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
        for column in table.c
    }
    for table in (responses, response_input_items, item_index, response_events, response_audit)
}


#: The one-statement commit's separator of a text column's values sent as one text
#: (``_column_value``): a control character, which JSON text never holds unescaped, nor an id
#: or an event type; a column whose values hold it goes as an array.
_SEP = "\x1f"


def _column_value(pg_type: str, column: tuple[Any, ...]) -> tuple[str, Any]:
    """How the one-statement commit sends a column's values: ``(form, value)``.

    As one text to split in the statement where the column's type and values allow (``"text"``:
    texts joined by ``_SEP``; ``"number"``: integers or floats joined by commas, in their exact
    ``repr``; ``"hex"``: byte strings in hex, ``-`` for NULL), else as an array (``"array"``).
    The driver checks each element of an array against three abstract base classes before it
    encodes it (~10 calls a paced token's row); a joined text is one C call a column. (No column
    a commit writes is a float today: ``recorded_at`` goes as the commit's time, ``fenced``.)"""
    try:
        if pg_type in ("TEXT", "JSON", "JSONB"):
            value = _SEP.join(column)
            if value and value.count(_SEP) == len(column) - 1:
                return "text", value
        elif pg_type in ("INTEGER", "BIGINT"):
            return "number", ",".join(map(int.__repr__, column))
        elif pg_type == "DOUBLE PRECISION":
            return "number", ",".join(map(float.__repr__, column))
        elif pg_type == "BYTEA":
            value = ",".join(["-" if b is None else b.hex() for b in column])
            if value:
                return "hex", value
    except TypeError:  # a NULL (or a value of another type) among them
        pass
    return "array", list(column)


def _value_size(value: Any) -> int:
    """A one-statement commit's column value's size: a joined text's length, or its elements'
    (an array, ``_column_value``'s last resort)."""
    if isinstance(value, str):
        return len(value)
    return sum(len(v) if isinstance(v, str | bytes) else 8 for v in value)


#: A column's parameter as an array in the one-statement commit, by its form (``_column_value``).
_ARRAY_OF = {
    "text": "string_to_array({mark}, E'\\x1f')",
    "number": "string_to_array({mark}, ',')::{type}[]",
    "hex": "string_to_array({mark}, ',', '-')",
    "array": "{mark}::{type}[]",
}


class _Part(NamedTuple):
    """One table's share of a one-statement commit: its columns, how each one's values are sent
    (``_column_value``; ``"now"``: not sent, the commit's time), and whether it updates rows
    rather than inserts them."""

    table: str
    columns: tuple[str, ...]
    forms: tuple[str, ...]
    updates: bool


def _fenced_sql(parts: tuple[_Part, ...]) -> str:
    """The text of ``_Statements.fenced``'s statement for these parts: ``$1``, the replica's id,
    ``$2``, the ``fence`` value its commits last read, ``$3`` the commit's time (every
    ``recorded_at``: form ``"now"``), then one parameter a column."""
    # (``own`` selects ``$3``, so that it has a type in a statement whose parts do not use it)
    writes = [
        "own AS (SELECT $3::double precision FROM replicas WHERE id = $1 AND fence = $2 FOR SHARE)"
    ]
    mark = 3
    for n, (table, columns, forms, updates) in enumerate(parts):
        types = _PG_TYPES[table]
        arrays, unnested, values = [], [], []
        for c, form in zip(columns, forms, strict=True):
            pg_type = types[c]
            if form == "now":
                values.append("$3::double precision")
                continue
            mark += 1
            # (JSON goes as text, cast below, as the driver sends it)
            is_json = pg_type in ("JSON", "JSONB")
            sql_type = "text" if is_json else pg_type.lower()
            arrays.append(_ARRAY_OF[form].format(mark=f"${mark}", type=sql_type))
            unnested.append(c)
            if is_json:
                values.append(f"x.{c}::{pg_type.lower()}")
            elif form == "hex":
                values.append(f"decode(x.{c}, 'hex')")
            else:
                values.append(f"x.{c}")
        rows = f"unnest({', '.join(arrays)}) AS x({', '.join(unnested)})"
        if updates:
            sets = ", ".join(f"{c} = {v}" for c, v in zip(columns[:-1], values, strict=False))
            write = f"UPDATE responses AS r SET {sets} FROM {rows} WHERE r.id = x.id AND EXISTS (SELECT 1 FROM own)"
        else:
            write = (
                f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} FROM {rows}"
                " WHERE EXISTS (SELECT 1 FROM own)"
            )
        writes.append(f"w{n} AS ({write})")
    return f"WITH {', '.join(writes)} SELECT count(*) FROM own"


def _bump_fence(owner: Any) -> Any:
    """Tell the replica ``owner`` (an expression) that one of its responses was claimed or
    deleted: its commits check their logs row by row again (``SqlStore._fence``)."""
    return (
        update(replicas_table)
        .where(replicas_table.c.id == owner)
        .values(fence=replicas_table.c.fence + 1)
    )


_EVENTS = select(_e.c.seq, _e.c.type, cast(_e.c.payload, Text))

# The chain, newest first. Each step looks up the previous id as a correlated subquery by primary
# key, not as a join of ``responses`` with the chain: as a join, SQLite with ``ANALYZE``
# statistics of a table under a million rows built a Bloom filter over every row of
# ``responses`` for each walk (17-22 ms at 200,000 responses, 86 ms at 800,000, on every request
# naming a ``previous_response_id``). The last step yields a NULL id (no previous response, or
# one that does not exist), which the outer select leaves out; a missing link is then a row
# without a response.
_chain = select(
    cast(bindparam("start", type_=Text), Text).label("chain_id"),
    literal(0, Integer).label("depth"),
).cte("chain", recursive=True)
_prev = _r.alias("prev")
_chain = _chain.union_all(
    select(
        select(_prev.c.previous_response_id)
        .where(_prev.c.id == _chain.c.chain_id)
        .scalar_subquery(),
        _chain.c.depth + 1,
    ).where(_chain.c.chain_id.is_not(None), _chain.c.depth <= _MAX_CHAIN)
)


def _last_event(column: Any, label: str) -> Any:
    """``column`` of a response's last event (a backward look-up of the key, one row)."""
    return (
        (select(column).where(_e.c.response_id == _r.c.id).order_by(_e.c.seq.desc()).limit(1))
        .scalar_subquery()
        .label(label)
    )


_CHAIN = (
    select(
        _chain.c.chain_id,
        *_r.c,
        _LAST_SEQ,
        _last_event(_e.c.type, "last_type"),
        _last_event(cast(_e.c.payload, Text), "last_payload"),
    )
    .select_from(_chain.outerjoin(_r, _r.c.id == _chain.c.chain_id))
    .where(_chain.c.chain_id.is_not(None))
    .order_by(_chain.c.depth)
)
_CHAIN_ITEMS = (
    select(response_input_items.c.response_id, response_input_items.c.item)
    .where(response_input_items.c.response_id.in_(bindparam("ids", expanding=True)))
    .order_by(response_input_items.c.response_id, response_input_items.c.position)
)
# The finished items of the responses of a chain still generating (no terminal event yet).
_CHAIN_EVENTS = (
    select(_e.c.response_id, _e.c.seq, _e.c.type, cast(_e.c.payload, Text))
    .where(_e.c.response_id.in_(bindparam("ids", expanding=True)), _e.c.type == OUTPUT_ITEM_DONE)
    .order_by(_e.c.response_id, _e.c.seq)
)

# Where each item is (``persistence.item_index``), with the item itself (the input item's row, or
# the ``output_item.done`` event) and its response's project and age, each a correlated look-up
# by primary key. Written as subqueries, not joins, so that every planner starts from the ids: as
# joins, SQLite started from the project's index on ``responses`` (one probe of the item index per
# response of the project: 6.6 ms at 2,000 responses, growing), and PostgreSQL, on tables freshly
# filled (no statistics yet), hash-joined whole tables (over 5 s at 100,000 responses).
_x = item_index
_ii = response_input_items
_FIND_ITEMS = select(
    _x.c.item_id,
    _x.c.response_id,
    _x.c.source,
    _x.c.position,
    select(_ii.c.item)
    .where(
        _ii.c.response_id == _x.c.response_id,
        _ii.c.position == _x.c.position,
        _x.c.source == "input",
    )
    .scalar_subquery(),
    select(cast(_e.c.payload, Text))
    .where(_e.c.response_id == _x.c.response_id, _e.c.seq == _x.c.seq, _x.c.source == "output")
    .scalar_subquery(),
    select(_r.c.project).where(_r.c.id == _x.c.response_id).scalar_subquery(),
    select(_r.c.created_at).where(_r.c.id == _x.c.response_id).scalar_subquery(),
).where(_x.c.item_id.in_(bindparam("ids", expanding=True)))

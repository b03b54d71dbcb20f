"""Database URLs and engines: the one place that knows SQLite needs hand-holding.

SQLite (through aiosqlite):

- WAL, so readers never block the writer; ``busy_timeout`` so a second process waits for the
  write lock instead of failing; ``foreign_keys=ON`` so deleting a response cascades.
- ``synchronous=FULL`` by default: every commit fsyncs the WAL, so an acknowledged event
  survives a power cut. ``NORMAL`` (allowed, opt-in) fsyncs only at checkpoints: still safe
  against a crashed *process*, but the last commits before a power cut or kernel panic may be
  lost (the database stays consistent).
- Transactions are begun by us, not by the sqlite3 module (which would only ``BEGIN`` before
  the first INSERT, leaving earlier SELECTs outside the transaction). Writers use
  ``BEGIN IMMEDIATE``: they take the write lock up front, so a check-then-insert is atomic and
  never fails half way with ``SQLITE_BUSY``. Readers use a plain ``BEGIN`` (a snapshot).
- The writer engine has one connection: SQLite has one writer at a time anyway.

PostgreSQL (through asyncpg) needs none of this; one engine serves readers and the writer.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import event, make_url, pool
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = [
    "DEFAULT_DATABASE_URL",
    "Generations",
    "Role",
    "Synchronous",
    "async_url",
    "create_engine",
    "needs_snapshot",
    "sqlite_path",
]

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./data/responses.db"

#: ``snapshot``: a SQLite reader for a file on a read-only filesystem, opened ``immutable``
#: (a WAL database closed cleanly has no ``-shm`` file, and one cannot be made there, so no
#: ordinary connection can open it); it sees the file as it is and nothing written later.
Role = Literal["writer", "reader", "migrations", "snapshot"]
Synchronous = Literal["FULL", "NORMAL"]

_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}


def async_url(database_url: str | URL) -> URL:
    """The URL with its async driver (``sqlite://`` -> ``sqlite+aiosqlite://``, and so on)."""
    url = make_url(database_url)
    backend = "postgresql" if url.get_backend_name() == "postgres" else url.get_backend_name()
    if backend not in _ASYNC_DRIVERS:
        raise ValueError(f"unsupported database {url.drivername!r}: use SQLite or PostgreSQL")
    if url.get_driver_name() in ("", "pysqlite", "psycopg", "psycopg2", backend):
        url = url.set(drivername=_ASYNC_DRIVERS[backend])
    return url


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL, or None for other databases; in-memory SQLite is refused
    because every connection would see a different database."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise ValueError(
            "in-memory SQLite is not supported (each connection would see a database of its "
            "own): give a file (in code, persistence.memory.MemoryStore keeps a store in memory)"
        )
    return Path(database)


def create_engine(
    database_url: str | URL,
    *,
    role: Role,
    synchronous: Synchronous = "FULL",
    busy_timeout_ms: int = 5000,
    pool_size: int = 5,
    statement_timeout_s: float | None = None,
) -> AsyncEngine:
    """An engine for one role; creates a SQLite file's parent directory.

    ``statement_timeout_s`` (PostgreSQL): the longest a connection attempt, a pool check-out or
    a statement may take, enforced by the client (asyncpg's ``command_timeout``: a frozen or
    unreachable server cannot stall a caller for longer) and by the server (``statement_timeout``).
    SQLite's equivalent is ``busy_timeout``."""
    url = async_url(database_url)
    path = sqlite_path(url)
    if path is None:
        return _postgres_engine(
            url, role=role, pool_size=pool_size, statement_timeout_s=statement_timeout_s
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
    return _sqlite_engine(
        url,
        role=role,
        synchronous=synchronous,
        busy_timeout_ms=int(busy_timeout_ms),
        pool_size=pool_size,
    )


def _postgres_engine(
    url: URL, *, role: Role, pool_size: int, statement_timeout_s: float | None
) -> AsyncEngine:
    if role == "migrations":
        return create_async_engine(url, poolclass=pool.NullPool)
    if statement_timeout_s is None:
        return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size)
    connect_args = {
        "timeout": statement_timeout_s,
        "command_timeout": statement_timeout_s,
        "server_settings": {
            "statement_timeout": str(int(statement_timeout_s * 1000)),
            # A transaction of this server sends its statements back to back; one left idle
            # is a frozen (SIGSTOP) or partitioned replica, whose row locks (the append fence)
            # would block the claims of the replicas taking its responses over: end it soon.
            "idle_in_transaction_session_timeout": str(int(min(statement_timeout_s, 1.0) * 1000)),
            # Every query here is a short look-up by key. JIT compiling one whose estimated cost
            # crossed ``jit_above_cost`` (a table just filled, not analyzed yet) took 1.1 s for a
            # 0.5 ms item look-up (bench.item_refs, 100,000 responses).
            "jit": "off",
        },
    }
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=statement_timeout_s,
        connect_args=connect_args,
    )


_WAL = "PRAGMA journal_mode = WAL"


def _switch_to_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Put the file in WAL unless it is already. Two processes opening a new file at once can
    both see it in rollback mode; the one that switches second may get "database is locked"
    straight away (SQLite does not wait on its busy handler for this), by which time the file
    is usually in WAL already: look again, and retry for up to ``busy_timeout_ms``."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode")
            if str(cursor.fetchone()[0]).lower() != "wal":
                cursor.execute(_WAL)
            return
        except Exception as exc:  # the driver's OperationalError, as adapted by SQLAlchemy
            if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)  # start-up only: blocking this process's loop briefly is fine


def needs_snapshot(path: Path) -> bool:
    """Whether the SQLite file ``path`` can only be read as an immutable snapshot: it is on a
    filesystem mounted read-only and has no ``-shm`` file (it was closed cleanly, so its WAL was
    checkpointed into it). With a ``-shm`` file left (a killed process) ordinary read-only
    connections work, and see what the WAL still holds, which a snapshot would not."""
    try:
        read_only = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
        return read_only and path.exists() and not path.with_name(path.name + "-shm").exists()
    except OSError:
        return False


class Generations:
    """Close every connection a SQLite process has to its file, checked out ones included.

    SQLite shares one ``-shm`` mapping among a process's connections to a file. One opened while
    the filesystem was read-only maps it read-only, and every connection opened after it shares
    that mapping until all of them are closed: the process cannot write the file again before.
    ``AsyncEngine.dispose`` closes only the connections in the pool; one checked out at that
    moment (a read in progress) goes back to the pool thrown away, and stays open there for
    good. Here every connection of a ``watch``-ed engine carries the generation it was opened
    in, and one of an earlier generation is closed as it is checked in."""

    def __init__(self) -> None:
        self.current = 0

    def watch(self, engine: AsyncEngine) -> AsyncEngine:
        def stamp(_dbapi_connection: Any, record: Any) -> None:
            record.info["generation"] = self.current

        def close_if_stale(_dbapi_connection: Any, record: Any) -> None:
            if record is not None and record.info.get("generation", self.current) < self.current:
                record.invalidate()

        # pool events move to the new pool on dispose, and stay on the old one
        event.listen(engine.sync_engine, "connect", stamp)
        event.listen(engine.sync_engine, "checkin", close_if_stale)
        return engine

    async def close_all(self, *engines: AsyncEngine) -> None:
        """Close every connection of ``engines``: those in their pools now, those checked out
        when they come back."""
        self.current += 1
        for engine in engines:
            await engine.dispose()


def _sqlite_engine(
    url: URL, *, role: Role, synchronous: Synchronous, busy_timeout_ms: int, pool_size: int
) -> AsyncEngine:
    if role == "snapshot":
        path = sqlite_path(url)
        assert path is not None
        snapshot = url.set(
            database=f"file:{path.resolve()}", query={"immutable": "1", "uri": "true"}
        )
        engine = create_async_engine(snapshot, pool_size=pool_size, max_overflow=pool_size)
        pragmas = [f"PRAGMA busy_timeout = {busy_timeout_ms}", "PRAGMA foreign_keys = ON"]
    elif role == "migrations":
        # Foreign keys stay OFF here: batch migrations recreate tables, and with them ON
        # dropping a parent table would cascade-delete every event. A migration runs in one
        # BEGIN IMMEDIATE transaction, so two processes starting at once take turns.
        engine = create_async_engine(url, poolclass=pool.NullPool)
        pragmas = [f"PRAGMA busy_timeout = {busy_timeout_ms}", _WAL]
    else:
        if role == "writer":
            engine = create_async_engine(url, pool_size=1, max_overflow=0)
        else:
            engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size)
        pragmas = [
            f"PRAGMA busy_timeout = {busy_timeout_ms}",
            _WAL,
            f"PRAGMA synchronous = {synchronous}",
            "PRAGMA foreign_keys = ON",
        ]
    begin = "BEGIN" if role in ("reader", "snapshot") else "BEGIN IMMEDIATE"

    def on_connect(dbapi_connection: Any, _record: object) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see on_begin)
        cursor = dbapi_connection.cursor()
        for pragma in pragmas:
            if pragma is _WAL:
                # Switching the journal mode takes an exclusive lock, which a server migrating
                # the same file holds off for as long as its migration runs ("database is
                # locked" even with busy_timeout). WAL is a property of the file: switch only a
                # file that is not in WAL yet. Migrations switch first, so a new file is in WAL
                # before any long transaction starts.
                _switch_to_wal(cursor, busy_timeout_ms)
                continue
            cursor.execute(pragma)
        cursor.close()

    def on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)

    event.listen(engine.sync_engine, "connect", on_connect)
    event.listen(engine.sync_engine, "begin", on_begin)
    return engine

"""The SQLite write path without the async adapters: one thread, one connection, one hop a batch.

Through SQLAlchemy and aiosqlite, every statement of a group commit (BEGIN, the tails query, one
``executemany`` per table, COMMIT, the pool's reset) is its own round trip to aiosqlite's thread:
a queue put, a thread wake-up, a future resolved through the event loop's self-pipe. A short
response took about 35 such hops per commit, and at one stream they were most of the server's
CPU (about 8 ms per 10-token response). Here a whole transaction is one function run on a
dedicated thread, so a commit costs one hop whatever it holds.

The connection is set up as ``persistence.database`` sets up the writer engine's: WAL (already
switched by the migrations or the engine), ``busy_timeout``, ``synchronous``, foreign keys on,
and ``BEGIN IMMEDIATE`` so a check-then-insert never fails half way with ``SQLITE_BUSY``.

Two settings of its own, for many logs written at once: a commit of 256 paced streams appends
one event to each of 256 logs, each on a page of its own, so every commit dirties hundreds of
pages. With SQLite's defaults (a 2 MiB page cache; a checkpoint once the WAL holds 1,000 pages,
here every second or third commit) those pages were read back and copied into the database file
again and again. A 64 MiB cache (``_CACHE_KIB``) and a checkpoint every 10,000 pages (now
every ``CHECKPOINT_INTERVAL_S``, about as many pages at 256 paced streams, see below) share that
work between many commits: at 256 paced streams (bench/RESULTS.md, "one row lock a commit"),
42.8 -> 38.2-38.5 µs of server CPU a token, p50 19.4-19.9 -> 7.1 ms, p99 68-89 -> 33-43 ms.
Either one alone did much less. Durability is the same (``synchronous`` still syncs the WAL at
every commit).

The checkpoint itself runs off the commit path: on its own connection and thread, a ``PASSIVE``
checkpoint (it waits for no reader or writer) at most every ``CHECKPOINT_INTERVAL_S`` while
commits come, started after a commit and never awaited by one. In the commit that crossed the
limit, a checkpoint of 10,000 pages stalled every stream waiting for that commit. The writer
connection keeps an automatic checkpoint only as a backstop, at ``_BACKSTOP_PAGES``, should the
checkpointer fall behind or fail (a failure is logged once, and retried with the next commit).

So under a steady load the ``-wal`` file is the backstop's size, about 400 MiB, not a checkpoint
interval's: a checkpoint beside a busy writer nearly always leaves frames committed while it ran,
SQLite writes the WAL from its start again only once none is left, and the backstop's checkpoint,
inside a commit, is the one that leaves none (after it the file is written over, not grown). At
256 paced streams that commit takes 15-17 ms against a median of 4, once every ~300 commits.
Copying the rest on the writer's thread after each checkpoint keeps the WAL near 50 MiB, and was
measured and not kept: each copy held a commit 3.7 ms (p50; at most 11) every half second, one
commit in 50, which moved the stream's p99 where the backstop's one in 300 does not
(bench/RESULTS.md, nineteenth session). A test holds the file to the backstop's size
(``tests/persistence/test_sqlite_writer.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from persistence.database import Synchronous

__all__ = ["CHECKPOINT_INTERVAL_S", "SqliteWriter"]

T = TypeVar("T")

log = logging.getLogger(__name__)

# The writer connection's page cache (KiB).
_CACHE_KIB = 65_536
#: The shortest time between two checkpoints: at 256 paced streams about 10,000 WAL pages.
CHECKPOINT_INTERVAL_S = 0.5
# The WAL size (pages) at which the writer checkpoints in its own commit: the backstop only.
_BACKSTOP_PAGES = 100_000


class SqliteWriter:
    def __init__(self, path: Path, *, synchronous: Synchronous, busy_timeout_ms: int) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        self._path = path
        # the checkpointer's connection waits and syncs as the writer's does
        self._checkpoint_pragmas = (
            f"PRAGMA busy_timeout = {int(busy_timeout_ms)}",
            f"PRAGMA synchronous = {synchronous}",
        )
        self._pragmas = (
            *self._checkpoint_pragmas,
            "PRAGMA foreign_keys = ON",
            f"PRAGMA cache_size = -{_CACHE_KIB}",
            f"PRAGMA wal_autocheckpoint = {_BACKSTOP_PAGES}",
        )
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._conn: sqlite3.Connection | None = None
        self._checkpoint_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sqlite-checkpoint"
        )
        self._checkpoint_conn: sqlite3.Connection | None = None
        self._checkpoint: asyncio.Future[None] | None = None
        #: The shortest time between two checkpoints (``CHECKPOINT_INTERVAL_S``; a test sets
        #: its own writer's, never the module's, which every writer of the process reads).
        self.checkpoint_interval_s = CHECKPOINT_INTERVAL_S
        self._last_checkpoint = time.monotonic()
        self._checkpoint_failed = False
        #: Checkpoints run by the checkpointer (not the backstop), since opening.
        self.checkpoints = 0

    async def transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the writer
        thread; roll back and re-raise if it (or the commit) raises."""
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._thread, self._run, work)
        now = time.monotonic()
        if self._checkpoint is None and now - self._last_checkpoint >= self.checkpoint_interval_s:
            self._last_checkpoint = now
            self._checkpoint = loop.run_in_executor(self._checkpoint_thread, self._run_checkpoint)
            self._checkpoint.add_done_callback(self._checkpoint_done)
        return result

    def _run_checkpoint(self) -> None:
        conn = self._checkpoint_conn
        if conn is None:
            conn = self._checkpoint_conn = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False
            )
            for pragma in self._checkpoint_pragmas:
                conn.execute(pragma)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            self._checkpoint_conn = None
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise

    def _checkpoint_done(self, future: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self.checkpoints += 1
            self._checkpoint_failed = False
        elif not self._checkpoint_failed:  # (a full or read-only disk fails every one)
            self._checkpoint_failed = True
            log.warning("SQLite checkpoint failed (%s); retried after the next commits", error)

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            conn = self._conn = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False
            )
            for pragma in self._pragmas:
                conn.execute(pragma)
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            self._roll_back(conn, reopen=isinstance(exc, sqlite3.OperationalError))
            raise
        return result

    def _roll_back(self, conn: sqlite3.Connection, *, reopen: bool) -> None:
        """Leave no transaction open behind a failure. After an operational error (locked,
        full, read-only, I/O) the connection is closed and the next transaction opens a new
        one: a connection that SQLite opened read-only (its filesystem was) stays read-only
        after the filesystem is writable again, and one stuck inside a transaction (its
        rollback failed too) would fail every later ``BEGIN``."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not conn.in_transaction and not reopen:
                return
        except sqlite3.Error:
            pass
        self._conn = None
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    async def close(self) -> None:
        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        def close_checkpointer() -> None:
            if self._checkpoint_conn is not None:
                self._checkpoint_conn.close()
                self._checkpoint_conn = None

        loop = asyncio.get_running_loop()
        try:
            if self._checkpoint is not None:
                with contextlib.suppress(Exception):
                    await self._checkpoint
            await loop.run_in_executor(self._checkpoint_thread, close_checkpointer)
            await loop.run_in_executor(self._thread, close)
        finally:
            self._checkpoint_thread.shutdown(wait=True)
            self._thread.shutdown(wait=True)

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
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from persistence.database import Synchronous

__all__ = ["SqliteWriter"]

T = TypeVar("T")


class SqliteWriter:
    def __init__(self, path: Path, *, synchronous: Synchronous, busy_timeout_ms: int) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        self._path = path
        self._pragmas = (
            f"PRAGMA busy_timeout = {int(busy_timeout_ms)}",
            f"PRAGMA synchronous = {synchronous}",
            "PRAGMA foreign_keys = ON",
        )
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._conn: sqlite3.Connection | None = None

    async def transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the writer
        thread; roll back and re-raise if it (or the commit) raises."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, work)

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
        except BaseException:
            self._roll_back(conn)
            raise
        return result

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        """Leave no transaction open behind a failure. If the rollback itself fails (a full
        disk, an I/O error), the connection is closed and the next transaction opens a new one:
        a connection stuck inside a transaction would fail every later ``BEGIN``."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not conn.in_transaction:
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

        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, close)
        finally:
            self._thread.shutdown(wait=True)

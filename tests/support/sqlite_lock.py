"""SQLite's write lock held by another connection, as a second process or an operator's
``sqlite3`` session would hold it (``BEGIN IMMEDIATE`` and nothing more), from a thread.

    with SqliteLock(path):             # held until the block ends
        ...
    with SqliteLock(path, hold_s=1):   # let go after a second, inside the block or not
        ...
    lock = SqliteLock(path); ...; lock.release()

(``tests/faults/storage.WriteLock`` holds it from another process, for server processes.)
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from types import TracebackType

__all__ = ["SqliteLock"]


class SqliteLock:
    def __init__(self, path: Path, *, hold_s: float | None = None) -> None:
        self._release = threading.Event()
        self._timed = hold_s is not None
        taken = threading.Event()

        def hold() -> None:
            connection = sqlite3.connect(path, isolation_level=None, timeout=10)
            try:
                connection.execute("BEGIN IMMEDIATE")
                taken.set()
                self._release.wait(30 if hold_s is None else hold_s)
                connection.execute("ROLLBACK")
            finally:
                connection.close()

        self._thread = threading.Thread(target=hold, daemon=True)
        self._thread.start()
        assert taken.wait(10), "could not take the lock"

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)

    def __enter__(self) -> SqliteLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timed and kind is None:
            self._thread.join(30)  # a timed hold ends by itself
        self.release()

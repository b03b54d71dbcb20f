"""Whether the store can write now, as its own writes and probes found.

Every commit and every probe reports here: a failure that looks like the database being
unreachable, frozen, read-only, full or locked (``is_unavailable``) starts an *outage*; the next
success ends it. The group commit retries a failed batch until ``retry_s`` after the outage
began, so one long outage costs each waiting writer at most that long, not that long per batch;
``/health`` and the service's admission of new writes read ``ok`` and ``reason``.

A row the database refuses (a constraint, bad data) is not an outage: it is that submission's
fault and fails it alone (see ``persistence.sql``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

import asyncpg
from sqlalchemy import exc as sa_exc

__all__ = ["StoreHealth", "describe", "is_unavailable"]

# PostgreSQL SQLSTATE classes that mean "the database cannot do it now", not "this data is bad":
# 08 connection exception, 53 insufficient resources (disk full, out of memory, too many
# connections), 57 operator intervention (shutdown, cannot connect now, query canceled by a
# statement timeout), 58 system error (I/O), 25006 read-only transaction, 40001/40P01
# serialization failure and deadlock (retrying is the documented answer).
_PG_UNAVAILABLE_CLASSES = ("08", "53", "57", "58")
_PG_UNAVAILABLE_STATES = ("25006", "40001", "40P01", "55P03")


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database is unavailable (retry later), False when it says the
    data was refused (or is a bug: never retried, never blamed on the database).

    SQLAlchemy wraps the driver's exception (``orig``), and its asyncpg adapter wraps asyncpg's
    once more (the adapter's ``Error``, raised ``from`` the original): the whole chain is read,
    and any link that says "unavailable" decides."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if _unavailable_here(link):
            return True
        orig = getattr(link, "orig", None)
        link = orig if isinstance(orig, BaseException) else link.__cause__
    return False


def _unavailable_here(exc: BaseException) -> bool:
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(state, str) and (
        state[:2] in _PG_UNAVAILABLE_CLASSES or state in _PG_UNAVAILABLE_STATES
    ):
        return True
    if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None:
        return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
    if isinstance(exc, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return True  # the pool could not hand out a connection in time
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return False
    if isinstance(exc, OSError):  # refused connections, resets, TimeoutError
        return True
    if isinstance(exc, sqlite3.OperationalError):  # locked, busy, full, read-only, I/O
        return True
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, sqlite3.IntegrityError | sqlite3.DataError | sqlite3.ProgrammingError
    ):
        return True
    if isinstance(
        exc, asyncpg.InterfaceError | asyncpg.InternalClientError | asyncpg.PostgresConnectionError
    ):
        # InternalClientError: the protocol met the server's goodbye mid-statement (a backend
        # terminated while the connection was idle); the connection is gone, not the data refused
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        return state[:2] in _PG_UNAVAILABLE_CLASSES or state in _PG_UNAVAILABLE_STATES
    return False


def describe(exc: BaseException) -> str:
    """One line for an operator: the driver's own message, without SQLAlchemy's boilerplate.
    SQLAlchemy wraps the driver's error (``orig``), and its asyncpg adapter wraps asyncpg's once
    more (raised ``from`` it): asyncpg's own is named (``InvalidCatalogNameError: database "x"
    does not exist``, not the adapter's ``Error``)."""
    orig = getattr(exc, "orig", None) or exc
    if orig is not exc and orig.__cause__ is not None:
        orig = orig.__cause__
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
    if not text and isinstance(orig, TimeoutError):
        text = "the database did not answer in time"
    return f"{type(orig).__name__}: {text}" if text else type(orig).__name__


class StoreHealth:
    """The store's view of its own writability. Plain attributes: read on every token."""

    __slots__ = ("_clock", "failing", "last_ok_at", "outage_since", "reason", "retry_s")

    def __init__(self, retry_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if retry_s < 0:
            raise ValueError("retry_s must be >= 0")
        self.retry_s = retry_s
        self._clock = clock
        #: True from the first failed write or probe of an outage until the next success.
        self.failing = False
        #: ``clock()`` when the current outage began (None while healthy).
        self.outage_since: float | None = None
        #: What the last failure was (None while healthy).
        self.reason: str | None = None
        #: ``clock()`` of the last successful write or probe.
        self.last_ok_at = clock()

    @property
    def ok(self) -> bool:
        return not self.failing

    def failed(self, exc: BaseException) -> float:
        """Record a failure; return how many seconds of retrying the outage has left (<= 0:
        give up now)."""
        now = self._clock()
        if self.outage_since is None:
            self.outage_since = now
        self.failing = True
        self.reason = describe(exc)
        return self.outage_since + self.retry_s - now

    def succeeded(self) -> None:
        self.last_ok_at = self._clock()
        self.failing = False
        self.outage_since = None
        self.reason = None

"""Which failures start an outage (retried) and which refuse the data (never retried)."""

from __future__ import annotations

import sqlite3

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from persistence.health import describe, is_unavailable


def _wrapped(orig: BaseException) -> sa_exc.DBAPIError:
    """What SQLAlchemy's asyncpg adapter raises: the driver's error as ``orig``."""
    return sa_exc.DBAPIError.instance("SELECT 1", None, orig, Exception)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError("reset by peer"),
        TimeoutError(),
        sqlite3.OperationalError("database is locked"),
        asyncpg.InterfaceError("another operation is in progress"),
        # a backend terminated while the connection was idle: the next statement meets its
        # goodbye half-way (seen in CI on the doorbell's sending connection)
        asyncpg.InternalClientError(
            "cannot switch to state 11; another operation (2) is in progress"
        ),
        asyncpg.exceptions.AdminShutdownError(
            "terminating connection due to administrator command"
        ),
        asyncpg.exceptions.DiskFullError("could not extend file"),
    ],
    ids=type,
)
def test_the_database_being_away_is_unavailable(exc: BaseException) -> None:
    assert is_unavailable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        sqlite3.IntegrityError("UNIQUE constraint failed"),
        asyncpg.exceptions.UniqueViolationError("duplicate key"),
        asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence"),
        ValueError("a bug, not an outage"),
    ],
    ids=type,
)
def test_refused_data_and_bugs_are_not_unavailable(exc: BaseException) -> None:
    assert not is_unavailable(exc)


def test_the_driver_error_under_sqlalchemys_wrapping_decides() -> None:
    assert is_unavailable(_wrapped(asyncpg.exceptions.AdminShutdownError("shutting down")))
    assert not is_unavailable(_wrapped(asyncpg.exceptions.UniqueViolationError("duplicate")))


async def test_describe_names_the_drivers_own_error_through_sqlalchemys_asyncpg_adapter() -> None:
    """SQLAlchemy's asyncpg adapter raises its own ``Error`` from asyncpg's; an operator reads
    asyncpg's name (``/health``'s reason, the logs, a server that cannot start)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from tests.support.postgres import ADMIN_DSN
    from tests.support.postgres import unavailable as pg_unavailable

    reason = await pg_unavailable()
    if reason is not None:
        pytest.skip(reason)
    base = ADMIN_DSN.rsplit("/", 1)[0].split("://", 1)[1]
    engine = create_async_engine(f"postgresql+asyncpg://{base}/no_such_database_for_describe")
    try:
        with pytest.raises(sa_exc.DBAPIError) as raised:
            async with engine.connect():
                pass
    finally:
        await engine.dispose()
    assert type(raised.value.orig).__name__ == "Error"  # the adapter's, raised from asyncpg's
    assert describe(raised.value) == (
        'InvalidCatalogNameError: database "no_such_database_for_describe" does not exist'
    )
    # an error with no driver beneath it keeps its own name
    assert describe(sqlite3.OperationalError("database is locked")) == (
        "OperationalError: database is locked"
    )

"""Start-up failures: what keeps a server from starting, said in one line.

A server that cannot start for a reason its operator can act on (no ``--script`` for the
scripted engine, a database it cannot reach, an address open to anyone without a key) raises
``StartupError`` from its lifespan. Starlette reports any lifespan failure to uvicorn with the
whole traceback as the message, and uvicorn logs that before "Application startup failed.
Exiting." (status 3): sixty lines of asyncpg's connection code to say "connection refused".
``StartupError`` is reported with its own message instead; anything else keeps its traceback
(a bug is a bug).

Settings that cannot be used are refused earlier, before anything starts (``SettingsError``,
``app.settings``: ``responses-ledger`` prints them and exits with status 2).
"""

from __future__ import annotations

import sys

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from starlette.types import Message, Send

from app.settings import SettingsError
from persistence.health import describe

__all__ = [
    "DATABASE_ERRORS",
    "StartupError",
    "cannot_listen",
    "check_database_url",
    "database_unreachable",
    "reported_in_one_line",
]

#: What opening or migrating a database raises when it cannot be reached or opened: the
#: connection's (refused, unknown host, timed out), the driver's (no such database, wrong
#: password, SQLite's unable to open), a URL no dialect reads.
DATABASE_ERRORS = (OSError, DBAPIError, ArgumentError, NoSuchModuleError)


class StartupError(Exception):
    """The server cannot start; the message says why and, where there is one, what to do."""


def reported_in_one_line(send: Send) -> Send:
    """``send`` for a lifespan scope: a ``lifespan.startup.failed`` sent while a
    ``StartupError`` is being handled carries that error's message, not the traceback."""

    async def send_(message: Message) -> None:
        if message.get("type") == "lifespan.startup.failed":
            # Starlette sends it from its ``except`` block: the error being handled is the one
            exc = sys.exc_info()[1]
            if isinstance(exc, StartupError):
                message = {**message, "message": str(exc)}
        await send(message)

    return send_


def database_unreachable(url: str, exc: BaseException) -> StartupError:
    """The start-up error of a database that cannot be opened: where (its password hidden) and
    what the driver said."""
    return StartupError(f"cannot open the database {_shown(url)}: {describe(exc)}")


def cannot_listen(host: str, port: int, exc: OSError) -> StartupError:
    """The start-up error of a listening address that cannot be had (in use, a name that does
    not resolve, an address not this host's), naming it (uvicorn's says only the system's words
    for a name)."""
    return StartupError(f"cannot listen on {host} port {port}: {exc.strerror or exc}")


def check_database_url(url: str) -> None:
    """Refuse (``SettingsError``) a database URL the server cannot use whatever the database
    says: one it cannot read, another database than SQLite or PostgreSQL, in-memory SQLite."""
    from persistence.database import async_url, sqlite_path

    try:
        sqlite_path(async_url(url))
    except (ArgumentError, ValueError) as exc:
        raise SettingsError(f"DATABASE_URL (--database-url) {_shown(url)}: {exc}") from None


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # (not a URL SQLAlchemy can read: said as given, nothing to hide in it)
        return url

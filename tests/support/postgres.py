"""Fresh PostgreSQL databases for tests.

The server is the one on 127.0.0.1:5432 (trust auth); ``$RESPONSES_LEDGER_TEST_PG`` overrides
the admin DSN. Each caller gets its own ``ledger_test_<random>`` database, dropped afterwards
(``WITH (FORCE)``, so a leaked connection cannot keep it alive).

    async with fresh_database() as url:      # url: "postgresql+asyncpg://...", empty database
        store = await open_store(url)

``unavailable()`` says why the server cannot be used (after trying to start it once), so a
fixture can skip with that reason.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

__all__ = ["ADMIN_DSN", "create_database", "drop_database", "fresh_database", "unavailable"]

ADMIN_DSN = os.environ.get("RESPONSES_LEDGER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

_start_attempted = False


async def unavailable() -> str | None:
    """None if the server answers; otherwise why not (after one attempt to start it)."""
    global _start_attempted
    reason = await _ping()
    if reason is None:
        return None
    if not _start_attempted:
        _start_attempted = True
        started = await asyncio.to_thread(_start_cluster)
        if started is not None:
            return f"PostgreSQL at {ADMIN_DSN} is down ({reason}) and {started}"
        for _ in range(20):
            await asyncio.sleep(0.5)
            reason = await _ping()
            if reason is None:
                return None
    return f"PostgreSQL at {ADMIN_DSN} is not reachable: {reason}"


async def create_database(prefix: str = "ledger_test") -> str:
    """Create an empty database; return its SQLAlchemy asyncpg URL."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return _url_for(name)


async def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def fresh_database(prefix: str = "ledger_test") -> AsyncIterator[str]:
    url = await create_database(prefix)
    try:
        yield url
    finally:
        await drop_database(url)


def _url_for(database: str) -> str:
    base = ADMIN_DSN.rsplit("/", 1)[0].split("://", 1)[1]
    return f"postgresql+asyncpg://{base}/{database}"


async def _ping() -> str | None:
    try:
        connection = await asyncpg.connect(ADMIN_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await connection.close()
    return None


def _start_cluster() -> str | None:
    """Start the local cluster as the brief says; None on success, else why not."""
    pg_ctlcluster = shutil.which("pg_ctlcluster")
    versions = sorted(Path("/etc/postgresql").glob("*")) if Path("/etc/postgresql").is_dir() else []
    if pg_ctlcluster is None or not versions:
        return "pg_ctlcluster or /etc/postgresql is missing, so it cannot be started"
    result = subprocess.run(
        [pg_ctlcluster, "--skip-systemctl-redirect", versions[-1].name, "main", "start"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, 2):  # 2: already running
        return f"pg_ctlcluster failed: {result.stderr.strip() or result.stdout.strip()}"
    return None

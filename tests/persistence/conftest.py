"""Resources for the persistence tests: database URLs and stores.

``postgres_url`` (session): a fresh, migrated PostgreSQL database for this test session,
dropped at the end; the tests are skipped, with the reason, if the server cannot be reached
or started. ``clean_postgres_url`` empties it before a test. Other suites can build the same
thing from ``tests.support.postgres``.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from persistence.migrate import upgrade_async
from tests.support.postgres import fresh_database, unavailable

_TABLES = (
    "responses, response_events, response_input_items, response_audit, server_secrets, replicas, "
    "conversations, conversation_items"
)


@pytest.fixture(scope="session")
async def postgres_url() -> AsyncIterator[str]:
    reason = await unavailable()
    if reason is not None:
        pytest.skip(reason)
    async with fresh_database() as url:
        await upgrade_async(url)
        yield url


@pytest.fixture
async def clean_postgres_url(postgres_url: str) -> str:
    connection = await asyncpg.connect(postgres_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await connection.execute(f"TRUNCATE {_TABLES} CASCADE")
    finally:
        await connection.close()
    return postgres_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file that does not exist yet (nor does its directory)."""
    return f"sqlite+aiosqlite:///{tmp_path / 'data' / 'ledger.db'}"


@pytest.fixture(scope="session")
async def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    await upgrade_async(f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture
def migrated_sqlite_url(_sqlite_template: Path, tmp_path: Path) -> str:
    """A new SQLite file already at head (a copy of one migrated once per session)."""
    path = tmp_path / "ledger.db"
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_url(request: pytest.FixtureRequest) -> str:
    """Each SQL backend in turn, migrated and empty: a new SQLite file, or the emptied
    session PostgreSQL database."""
    name = "migrated_sqlite_url" if request.param == "sqlite" else "clean_postgres_url"
    url: str = request.getfixturevalue(name)
    return url

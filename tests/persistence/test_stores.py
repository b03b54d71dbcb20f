"""The contract suite against every backend: memory, SQLite (temp file), PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from persistence.memory import MemoryStore
from persistence.sql import open_store
from persistence.store import EventStore
from tests.persistence.contract import EventStoreContract


class TestMemoryStore(EventStoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        store = MemoryStore()
        yield store
        await store.close()


class TestSqliteStore(EventStoreContract):
    @pytest.fixture
    async def store(self, migrated_sqlite_url: str) -> AsyncIterator[EventStore]:
        store = await open_store(migrated_sqlite_url, commit_window_ms=1.0, migrate=False)
        yield store
        await store.close()


@pytest.mark.postgres
class TestPostgresStore(EventStoreContract):
    @pytest.fixture
    async def store(self, clean_postgres_url: str) -> AsyncIterator[EventStore]:
        store = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
        yield store
        await store.close()

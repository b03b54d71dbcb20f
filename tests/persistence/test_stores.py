"""The contract suite against every backend: memory, SQLite (temp file), PostgreSQL."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from persistence.errors import Fenced, NotFound
from persistence.memory import MemoryStore
from persistence.sql import open_store
from persistence.store import EventStore
from tests.persistence.contract import EventStoreContract
from tests.persistence.factories import completed, created, delta, new_response


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


@pytest.mark.postgres
async def test_a_claim_fences_out_the_old_owners_appends(clean_postgres_url: str) -> None:
    """Two stores on one database, as two replicas: once B claims A's response, A's appends
    fail with ``Fenced`` and B's go on at the next seq."""
    a = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
    b = await open_store(clean_postgres_url, commit_window_ms=1.0, migrate=False)
    try:
        new = dataclasses.replace(new_response(), owner="rep_a")
        await a.create_response(new)
        await a.append(new.id, [created(new.id), delta(1)], 0)
        assert await b.claim(new.id, "rep_a", "rep_b") == 1
        with pytest.raises(Fenced):
            await a.append(new.id, [delta(2, "late")], 2)
        await b.append(new.id, [delta(2, "b's")], 2)
        await b.append(new.id, [completed(new.id, 3)], 3)
        assert [e.seq for e in await a.load(new.id)] == [0, 1, 2, 3]
        assert (await a.load(new.id))[2].payload["delta"] == "b's"
        # deleted by B while A writes: A's next append finds no row and leaves none
        other = dataclasses.replace(new_response(), owner="rep_a")
        await a.create_response(other)
        await a.append(other.id, [created(other.id)], 0)
        assert await b.delete(other.id)
        with pytest.raises(NotFound):
            await a.append(other.id, [delta(1)], 1)
        assert await a.load(other.id) == []
    finally:
        await a.close()
        await b.close()

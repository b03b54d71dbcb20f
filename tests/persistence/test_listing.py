"""``list_responses`` and ``load_times`` (``persistence.listing``, the audit page's reads) against
every backend: memory, SQLite, PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from persistence.conversations import ConversationRow
from persistence.listing import ResponseQuery
from persistence.memory import MemoryStore
from persistence.sql import open_store
from persistence.store import EventStore
from tests.persistence.factories import (
    completed,
    created,
    delta,
    failed,
    new_response,
    user_message,
)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str | None:
    """None for the memory store, else a migrated, empty database of each kind."""
    if request.param == "memory":
        return None
    url: str = request.getfixturevalue(
        "migrated_sqlite_url" if request.param == "sqlite" else "clean_postgres_url"
    )
    return url


@pytest.fixture
async def store(backend: str | None) -> AsyncIterator[EventStore]:
    the_store: EventStore = (
        MemoryStore()
        if backend is None
        else await open_store(backend, commit_window_ms=1.0, migrate=False)
    )
    yield the_store
    await the_store.close()


async def _make(
    store: EventStore, text: str, *, created_at: int, end: str = "completed", **kwargs: object
) -> str:
    item = user_message(text, item_id=f"msg_in_{created_at}")
    new = new_response(created_at=created_at, input_items=[item], **kwargs)  # type: ignore[arg-type]
    await store.create_response(new)
    events = [created(new.id), delta(1, "x")]
    events.append(completed(new.id, 2) if end == "completed" else failed(new.id, 2))
    await store.append(new.id, events, 0)
    return new.id


async def _ids(store: EventStore, **filters: object) -> list[str]:
    rows, _ = await store.list_responses(ResponseQuery(**filters))  # type: ignore[arg-type]
    return [row.id for row in rows]


async def test_filters_each_and_together_newest_first(store: EventStore) -> None:
    a = await _make(store, "weather in Paris", created_at=1_000, project="alpha")
    b = await _make(
        store, "100% <script>x</script> a1b", created_at=2_000, project="beta", model="m2"
    )
    c = await _make(store, "WEATHER in Rome", created_at=3_000, project="alpha", end="failed")
    assert await _ids(store) == [c, b, a]
    assert await _ids(store, status="failed") == [c]
    assert await _ids(store, status="completed") == [b, a]
    assert await _ids(store, model="m2") == [b]
    assert await _ids(store, project="alpha") == [c, a]
    assert await _ids(store, since=2_000) == [c, b]
    assert await _ids(store, until=2_000) == [a]
    assert await _ids(store, since=1_500, until=3_000) == [b]
    assert await _ids(store, text="weather") == [c, a]  # any case
    assert await _ids(store, text="<script>") == [b]
    assert await _ids(store, text="100%") == [b]  # LIKE's wildcards are plain characters
    assert await _ids(store, text="a_b") == []  # "_" too
    assert await _ids(store, text=a[-10:]) == [a]  # the id
    assert await _ids(store, text="weather", project="alpha", status="completed") == [a]
    rows, _ = await store.list_responses(ResponseQuery(status="failed"))
    assert rows[0].status == "failed" and rows[0].last_seq == 2 and rows[0].project == "alpha"


async def test_pages_newest_first(store: EventStore) -> None:
    ids = [await _make(store, f"n{i}", created_at=10_000 + i) for i in range(5)]
    first, more = await store.list_responses(ResponseQuery(limit=2))
    assert [r.id for r in first] == ids[:2:-1] and more
    last, more = await store.list_responses(ResponseQuery(limit=2, offset=4))
    assert [r.id for r in last] == [ids[0]] and not more
    with pytest.raises(ValueError):
        ResponseQuery(limit=0)


async def test_the_chain_forward_and_a_conversations_turns(store: EventStore) -> None:
    first = await _make(store, "one", created_at=20_000)
    second = await _make(store, "two", created_at=20_001, previous=first)
    other = await _make(store, "three", created_at=20_002)
    assert await _ids(store, previous_response_id=first) == [second]
    assert await _ids(store, previous_response_id=second) == []
    await store.conversations.create(ConversationRow("conv_l", "default", 20_000, {}), [])
    await store.conversations.append(
        "conv_l", "default", [user_message("hi", item_id="msg_c1")], response_id=other
    )
    await store.conversations.append(
        "conv_l", "default", [user_message("hi", item_id="msg_c2")], response_id=first
    )
    await store.conversations.append("conv_l", "default", [user_message("x", item_id="msg_c3")])
    assert await _ids(store, conversation="conv_l") == [other, first]
    assert await _ids(store, conversation="conv_none") == []


async def test_load_times_gives_each_event_its_commits_time(store: EventStore) -> None:
    new = new_response()
    await store.create_response(new)
    before = time.time()
    await store.append(new.id, [created(new.id), delta(1)], 0)
    await store.append(new.id, [delta(2), completed(new.id, 3)], 2)
    after = time.time()
    timed = await store.load_times(new.id)
    assert [(seq, type_) for seq, type_, _ in timed] == [
        (e.seq, e.type) for e in await store.load(new.id)
    ]
    assert [seq for seq, _, _ in timed] == [0, 1, 2, 3]
    times = [t for _, _, t in timed]
    assert times[0] == times[1] and times[2] == times[3]  # one commit, one time
    assert before - 1 <= times[0] <= times[2] <= after + 1
    assert await store.load_times("resp_missing") == []

"""The conversation store's contract (``persistence.conversations``) against every backend:
memory, SQLite, PostgreSQL. The log is append-only: a deleted item leaves a ``deleted`` entry
and its ``added`` entry stays."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from persistence.conversations import ConversationRow, ConversationStore, DuplicateItem
from persistence.errors import NotFound
from persistence.memory import MemoryStore
from persistence.sql import SqlStore, open_store


def _message(ident: str, text: str, role: str = "user") -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": ident,
        "role": role,
        "status": "completed",
        "content": [{"type": part, "text": text}],
    }


def _row(ident: str = "conv_1", project: str = "alpha") -> ConversationRow:
    return ConversationRow(ident, project, 1_700_000_000, {"topic": "weather"})


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
async def store(backend: str | None) -> AsyncIterator[ConversationStore]:
    if backend is None:
        yield MemoryStore().conversations
        return
    sql = await open_store(backend, migrate=False)
    try:
        yield sql.conversations
    finally:
        await sql.close()


async def test_create_get_update_delete(store: ConversationStore) -> None:
    await store.create(_row(), [_message("msg_1", "hello")])
    assert await store.get("conv_1", "alpha") == _row()
    assert await store.get("conv_1", "beta") is None  # another project's: as if missing
    assert await store.get("conv_none", "alpha") is None
    updated = await store.update("conv_1", "alpha", {"topic": "rain"})
    assert updated is not None and updated.metadata == {"topic": "rain"}
    assert (await store.get("conv_1", "alpha")) == ConversationRow(
        "conv_1", "alpha", 1_700_000_000, {"topic": "rain"}
    )
    assert await store.update("conv_1", "beta", {}) is None
    assert not await store.delete("conv_1", "beta")
    assert await store.delete("conv_1", "alpha")
    assert await store.get("conv_1", "alpha") is None
    assert not await store.delete("conv_1", "alpha")
    with pytest.raises(NotFound):
        await store.items("conv_1", "alpha")
    with pytest.raises(NotFound):
        await store.append("conv_1", "alpha", [_message("msg_2", "late")])


async def test_items_in_order_pages_and_deletions(store: ConversationStore) -> None:
    await store.create(_row(), [_message(f"msg_{n}", f"text {n}") for n in range(3)])
    await store.append(
        "conv_1",
        "alpha",
        [_message(f"msg_{n}", f"text {n}", "assistant") for n in range(3, 7)],
        response_id="resp_1",
    )
    ids = [item["id"] for item in await store.items("conv_1", "alpha")]
    assert ids == [f"msg_{n}" for n in range(7)]
    page, more = await store.list_items("conv_1", "alpha", after=None, limit=3, order="asc")
    assert [i["id"] for i in page] == ["msg_0", "msg_1", "msg_2"] and more
    page, more = await store.list_items("conv_1", "alpha", after="msg_2", limit=10, order="asc")
    assert [i["id"] for i in page] == ["msg_3", "msg_4", "msg_5", "msg_6"] and not more
    page, more = await store.list_items("conv_1", "alpha", after="msg_4", limit=2, order="desc")
    assert [i["id"] for i in page] == ["msg_3", "msg_2"] and more
    assert await store.get_item("conv_1", "alpha", "msg_5") == _message(
        "msg_5", "text 5", "assistant"
    )
    assert await store.delete_item("conv_1", "alpha", "msg_5")
    assert not await store.delete_item("conv_1", "alpha", "msg_5")  # already gone
    assert not await store.delete_item("conv_1", "alpha", "msg_none")
    assert await store.get_item("conv_1", "alpha", "msg_5") is None
    assert [i["id"] for i in await store.items("conv_1", "alpha")] == [
        "msg_0",
        "msg_1",
        "msg_2",
        "msg_3",
        "msg_4",
        "msg_6",
    ]
    with pytest.raises(NotFound):  # a deleted item is no cursor
        await store.list_items("conv_1", "alpha", after="msg_5", limit=10, order="asc")
    with pytest.raises(DuplicateItem):  # an id is never reused, deleted or not
        await store.append("conv_1", "alpha", [_message("msg_5", "again")])
    with pytest.raises(DuplicateItem):
        await store.append("conv_1", "alpha", [_message("msg_7", "a"), _message("msg_7", "b")])
    assert len(await store.items("conv_1", "alpha")) == 6  # the refused appends left nothing
    for call in (
        store.items("conv_1", "beta"),
        store.list_items("conv_1", "beta", after=None, limit=1, order="asc"),
        store.get_item("conv_1", "beta", "msg_0"),
        store.delete_item("conv_1", "beta", "msg_0"),
        store.append("conv_1", "beta", [_message("msg_8", "x")]),
    ):
        with pytest.raises(NotFound):
            await call
    assert await store.get_item("conv_1", "alpha", "msg_0") is not None


async def test_find_items_sees_what_the_projects_conversations_hold_now(
    store: ConversationStore,
) -> None:
    await store.create(_row("conv_1"), [_message("msg_a", "one"), _message("msg_b", "two")])
    await store.create(_row("conv_2"), [_message("msg_c", "three")])
    await store.create(_row("conv_3", project="beta"), [_message("msg_d", "four")])
    found = await store.find_items(["msg_a", "msg_c", "msg_d", "msg_none", "x" * 300], "alpha")
    assert found == {"msg_a": _message("msg_a", "one"), "msg_c": _message("msg_c", "three")}
    assert await store.find_items(["msg_d"], "beta") == {"msg_d": _message("msg_d", "four")}
    assert await store.delete_item("conv_1", "alpha", "msg_a")
    assert await store.delete("conv_2", "alpha")
    assert await store.find_items(["msg_a", "msg_b", "msg_c"], "alpha") == {
        "msg_b": _message("msg_b", "two")
    }
    # one id in two conversations: the newest entry
    await store.create(_row("conv_4"), [_message("msg_b", "two, again")])
    assert await store.find_items(["msg_b"], "alpha") == {"msg_b": _message("msg_b", "two, again")}
    assert await store.find_items([], "alpha") == {}


async def test_more_ids_than_one_statement_can_take(store: ConversationStore) -> None:
    # a request may name that many items (the drivers refuse a statement of over 32,767
    # arguments: it was a 503, "the database is unavailable", on PostgreSQL)
    await store.create(_row("conv_1"), [_message("msg_a", "one")])
    found = await store.find_items([f"msg_none_{n}" for n in range(40_000)] + ["msg_a"], "alpha")
    assert found == {"msg_a": _message("msg_a", "one")}
    new = [_message(f"msg_new_{n}", "x") for n in range(12_000)]
    with pytest.raises(DuplicateItem):  # the id already held comes in the second part
        await store.append("conv_1", "alpha", [*new, _message("msg_a", "again")])
    assert [item["id"] for item in await store.items("conv_1", "alpha")] == ["msg_a"]


async def test_concurrent_appends_to_one_conversation_all_land(store: ConversationStore) -> None:
    """Two writers never take the same seq: every append lands, each one whole."""
    await store.create(_row(), [])
    await asyncio.gather(
        *(
            store.append("conv_1", "alpha", [_message(f"m{n}a", "a"), _message(f"m{n}b", "b")])
            for n in range(10)
        )
    )
    ids = [item["id"] for item in await store.items("conv_1", "alpha")]
    assert sorted(ids) == sorted(f"m{n}{x}" for n in range(10) for x in "ab")
    for n in range(10):
        assert ids.index(f"m{n}b") == ids.index(f"m{n}a") + 1


async def test_the_sql_log_keeps_deletions_as_entries(migrated_sqlite_url: str) -> None:
    sql: SqlStore = await open_store(migrated_sqlite_url, migrate=False)
    try:
        await sql.conversations.create(
            _row(), [_message("msg_1", "hello"), _message("msg_2", "bye")]
        )
        await sql.conversations.delete_item("conv_1", "alpha", "msg_1")
    finally:
        await sql.close()
    import sqlite3

    db = sqlite3.connect(migrated_sqlite_url.split("///", 1)[1])
    try:
        log = db.execute(
            "SELECT seq, kind, item_id FROM conversation_items ORDER BY seq"
        ).fetchall()
        current = db.execute("SELECT item_id, role FROM conversation_current_items").fetchall()
        timeline = db.execute(
            "SELECT kind, text FROM conversation_timeline ORDER BY seq"
        ).fetchall()
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("UPDATE conversation_items SET item_id = 'x'")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("DELETE FROM conversation_items")
    finally:
        db.close()
    assert log == [(0, "added", "msg_1"), (1, "added", "msg_2"), (2, "deleted", "msg_1")]
    assert current == [("msg_2", "user")]
    assert timeline == [("added", "hello"), ("added", "bye"), ("deleted", None)]

"""Every query in persistence/COOKBOOK.md runs, on the database(s) it is written for, against
a small fabricated conversation, and the ones about a response find it."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import asyncpg
import pytest

from persistence.conversations import ConversationRow
from persistence.sql import SqlStore, open_store
from tests.persistence.factories import fabricate_conversation

_COOKBOOK = Path(__file__).resolve().parents[2] / "persistence" / "COOKBOOK.md"
_BLOCK = re.compile(r"```sql\n-- (both|sqlite3|psql)\n(.*?)```", re.DOTALL)


def _queries(dialect: str) -> list[str]:
    text = _COOKBOOK.read_text()
    blocks = _BLOCK.findall(text)
    assert len(blocks) == text.count("```sql"), "every sql block starts with -- both|sqlite3|psql"
    return [sql for tag, sql in blocks if tag in ("both", dialect)]


def test_the_cookbook_has_queries_for_both() -> None:
    assert len(_queries("sqlite3")) >= 12
    assert len(_queries("psql")) >= 12


async def test_every_cookbook_query_runs(sql_url: str) -> None:
    store = await open_store(sql_url, migrate=False)
    try:
        conversation = await fabricate_conversation(store)
        await _fabricate_conversation_items(store, conversation.r2)
    finally:
        await store.close()
    dialect = "sqlite3" if sql_url.startswith("sqlite") else "psql"
    # msg_2: r2's answer (an output item); in_1: r1's question (an input item)
    queries = [
        q.replace("resp_abc123", conversation.r2).replace("msg_abc123", "msg_2")
        for q in _queries(dialect)
    ]
    queries += [q.replace("msg_2", "in_1") for q in queries if "item_index" in q]
    if dialect == "sqlite3":
        connection = sqlite3.connect(sql_url.split("///", 1)[1])
        try:
            results = [connection.execute(q).fetchall() for q in queries]
        finally:
            connection.close()
    else:
        pg = await asyncpg.connect(sql_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            results = [await pg.fetch(q) for q in queries]
        finally:
            await pg.close()
    for query, rows in zip(queries, results, strict=True):
        if (conversation.r2 in query and "function_calls" not in query) or "item_index" in query:
            assert rows, f"no rows for:\n{query}"
        if "conv_abc123" in query or "FROM conversations" in query:
            assert rows, f"no rows for:\n{query}"
    assert [tuple(r) for r in results[0]] == [("completed", "It is 21 °C in Paris.")]


async def _fabricate_conversation_items(store: SqlStore, response_id: str) -> None:
    """``conv_abc123``: a user message, the turn of ``response_id``, and one deletion."""

    def message(ident: str, role: str, text: str) -> dict[str, object]:
        part = "output_text" if role == "assistant" else "input_text"
        content = [{"type": part, "text": text}]
        return {
            "type": "message",
            "id": ident,
            "role": role,
            "status": "completed",
            "content": content,
        }

    row = ConversationRow("conv_abc123", "default", 100, {"topic": "weather"})
    await store.conversations.create(row, [message("msg_c1", "user", "Hello")])
    turn = [message("msg_c2", "user", "Weather?"), message("msg_c3", "assistant", "Sunny.")]
    await store.conversations.append(row.id, row.project, turn, response_id=response_id)
    await store.conversations.delete_item(row.id, row.project, "msg_c1")


@pytest.mark.parametrize("dialect", ["sqlite3", "psql"])
def test_placeholders_are_consistent(dialect: str) -> None:
    for query in _queries(dialect):
        assert "resp_" not in query.replace("resp_abc123", "")

"""The cookbook views answer questions about a small fabricated conversation (see
``factories.fabricate_conversation``), on both databases."""

from __future__ import annotations

import datetime
import re
import sqlite3

import asyncpg

from persistence.sql import open_store
from tests.persistence.factories import fabricate_conversation


async def _query(url: str, sql: str) -> list[tuple[object, ...]]:
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.split("///", 1)[1])
        try:
            return [tuple(row) for row in connection.execute(sql).fetchall()]
        finally:
            connection.close()
    pg = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        return [tuple(row) for row in await pg.fetch(sql)]
    finally:
        await pg.close()


async def test_views_answer_the_cookbook_questions(sql_url: str) -> None:
    store = await open_store(sql_url, migrate=False)
    try:
        c = await fabricate_conversation(store)
    finally:
        await store.close()

    assert await _query(
        sql_url, "SELECT response_id, status, text FROM response_text ORDER BY created_at"
    ) == [
        (c.r1, "completed", "Let me check. "),
        (c.r2, "completed", "It is 21 °C in Paris."),
        (c.r3, "completed", "You're welcome."),
        (c.r4, "in_progress", None),
    ]

    assert await _query(
        sql_url,
        "SELECT response_id, item_id, call_id, name, arguments, output, output_response_id "
        "FROM function_calls ORDER BY call_id",
    ) == [
        (c.r1, "fc_1", "call_1", "get_weather", '{"city":"Paris"}', '{"temp_c": 21}', c.r2),
        (c.r4, "fc_9", "call_9", "lookup", "{}", None, None),
    ]

    assert await _query(
        sql_url,
        "SELECT root_id, depth, response_id, previous_response_id "
        "FROM conversation_chains ORDER BY created_at",
    ) == [
        (c.r1, 0, c.r1, None),
        (c.r1, 1, c.r2, c.r1),
        (c.r1, 2, c.r3, c.r2),
        (c.r4, 0, c.r4, None),
    ]

    assert await _query(
        sql_url,
        "SELECT response_id, output_index, item_id, item_type, status "
        "FROM response_output_items ORDER BY response_id = "
        f"'{c.r1}' DESC, response_id, output_index",
    ) == [
        (c.r1, 0, "msg_1", "message", "completed"),
        (c.r1, 1, "fc_1", "function_call", "completed"),
        *sorted(
            [
                (c.r2, 0, "msg_2", "message", "completed"),
                (c.r3, 0, "msg_3", "message", "completed"),
                (c.r4, 0, "fc_9", "function_call", "completed"),
            ]
        ),
    ]

    timeline = await _query(
        sql_url,
        "SELECT seq, type, item_id, text, recorded_at FROM response_timeline "
        f"WHERE response_id = '{c.r4}' ORDER BY seq",
    )
    assert [row[:4] for row in timeline] == [
        (0, "response.created", None, None),
        (1, "response.output_item.done", "fc_9", None),
        (2, "response.output_text.delta", "msg_4", "Hmm"),
    ]
    for *_, recorded_at in timeline:
        if isinstance(recorded_at, str):
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", recorded_at)
        else:
            assert isinstance(recorded_at, datetime.datetime) and recorded_at.tzinfo

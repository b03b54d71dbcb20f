"""The cookbook views answer questions about a small fabricated conversation, on both
databases: r1 calls a function, r2 carries its output and answers, r3 follows up (a 3-link
chain), r4 stands alone and is still streaming."""

from __future__ import annotations

import datetime
import re
import sqlite3
from dataclasses import dataclass

import asyncpg

from persistence.records import StoredEvent
from persistence.sql import SqlStore, open_store
from tests.persistence.factories import (
    completed,
    created,
    delta,
    function_call_done,
    function_call_output,
    message_done,
    new_response,
    text_done,
    user_message,
)


@dataclass(frozen=True)
class Conversation:
    r1: str
    r2: str
    r3: str
    r4: str


async def _log(store: SqlStore, rid: str, events: list[StoredEvent]) -> None:
    await store.append(rid, events, 0)


async def _fabricate(store: SqlStore) -> Conversation:
    n1 = new_response(
        input_items=[user_message("Weather in Paris?", item_id="in_1")], created_at=100
    )
    await store.create_response(n1)
    r1 = n1.id
    await _log(
        store,
        r1,
        [
            created(r1),
            text_done(1, "Let me check. ", item_id="msg_1"),
            message_done(2, "Let me check. ", item_id="msg_1"),
            function_call_done(
                3,
                item_id="fc_1",
                call_id="call_1",
                name="get_weather",
                arguments='{"city":"Paris"}',
                output_index=1,
            ),
            completed(r1, 4),
        ],
    )
    n2 = new_response(
        previous=r1,
        input_items=[function_call_output("call_1", '{"temp_c": 21}', item_id="fco_1")],
        created_at=200,
    )
    await store.create_response(n2)
    r2 = n2.id
    answer = "It is 21 °C in Paris."
    await _log(
        store,
        r2,
        [
            created(r2),
            text_done(1, answer, item_id="msg_2"),
            message_done(2, answer, item_id="msg_2"),
            completed(r2, 3),
        ],
    )
    n3 = new_response(
        previous=r2, input_items=[user_message("Thanks!", item_id="in_3")], created_at=300
    )
    await store.create_response(n3)
    r3 = n3.id
    await _log(
        store,
        r3,
        [
            created(r3),
            text_done(1, "You're ", item_id="msg_3"),
            StoredEvent(
                2,
                "response.output_text.done",
                {"item_id": "msg_3", "output_index": 0, "content_index": 1, "text": "welcome."},
            ),
            message_done(3, "You're welcome.", item_id="msg_3"),
            completed(r3, 4),
        ],
    )
    n4 = new_response(created_at=400)
    await store.create_response(n4)
    r4 = n4.id
    await _log(
        store,
        r4,
        [
            created(r4),
            function_call_done(1, item_id="fc_9", call_id="call_9", name="lookup", arguments="{}"),
            delta(2, "Hmm", item_id="msg_4"),
        ],
    )
    return Conversation(r1, r2, r3, r4)


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
        c = await _fabricate(store)
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

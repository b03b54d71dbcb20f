"""``item_reference`` look-ups with many stored responses: the item index (issue 18's target).

``python -m bench.item_refs [--responses 100000] [--postgres] [--database-url URL]``

Stores ``--responses`` finished responses through the store's own write path (each with one
user message as input and a reasoning item and a message as output: three indexed items), then
times, through :mod:`app.item_refs` (what ``POST /v1/responses`` runs before rendering):

- one reference to the output message of a random stored response;
- six references (a three-turn Vercel AI SDK chat: two items per earlier turn), one query;
- one reference to an input item;
- one reference to an item added through the conversation items API (1,000 conversations of
  two items; found through ``conversation_items``' item id index after the item index misses);
- a reference to a missing id (the 400 path);
- for scale, ``load_chain`` of a one-response ``previous_response_id`` chain (a chain look-up).

Medians and 99th percentiles of 500 look-ups at random ids, in milliseconds. Target: under 5 ms
with 100,000 stored responses, on SQLite and PostgreSQL. ``--postgres`` makes (and drops) a
database of its own on ``postgresql://postgres@127.0.0.1:5432`` (``RESPONSES_LEDGER_TEST_PG``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from app import item_refs
from app.ids import new_id
from bench.stats import percentile
from domain.builder import ResponseBuilder, Usage
from domain.projections import payload, payload_json
from persistence.conversations import ConversationRow
from persistence.records import NewResponse, StoredEvent
from persistence.sql import SqlStore, open_store

_ADMIN_DSN = os.environ.get("RESPONSES_LEDGER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_PROJECT = "bench"


def _log(response_id: str) -> list[StoredEvent]:
    skeleton = {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "model": "bench",
        "tools": [],
    }
    b = ResponseBuilder(skeleton, new_id=new_id)
    b.created()
    b.in_progress()
    b.open_reasoning()
    b.append("thinking about it")
    b.open_message()
    b.append("an answer")
    b.finish("completed", usage=Usage(1, 0, 4, 2), completed_at=1)
    return [StoredEvent(e.sequence_number, e.type, payload(e), payload_json(e)) for e in b.take()]


async def _store_one(store: SqlStore, created_at: int) -> tuple[str, list[str]]:
    """One finished response; its (input item id, [output item ids])."""
    response_id = new_id("resp")
    input_id = new_id("msg")
    item = {
        "id": input_id,
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
    }
    create = store.submit_create(
        NewResponse(
            id=response_id,
            model="bench",
            created_at=created_at,
            previous_response_id=None,
            background=False,
            request={"model": "bench", "input": [item]},
            input_items=[item],
            project=_PROJECT,
        )
    )
    events = _log(response_id)
    await asyncio.gather(create, store.submit(response_id, events, 0))
    outputs = [e.payload["item"]["id"] for e in events if e.type == "response.output_item.done"]
    return input_id, outputs


async def _timings(fn: Callable[[], Awaitable[Any]], runs: int = 500) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), percentile(times, 0.99)


async def measure(url: str, responses: int) -> dict[str, tuple[float, float]]:
    store = await open_store(url)
    try:
        started = time.perf_counter()
        stored: list[tuple[str, list[str]]] = []
        for offset in range(0, responses, 500):
            count = min(500, responses - offset)
            stored.extend(
                await asyncio.gather(*(_store_one(store, offset + i) for i in range(count)))
            )
        fill_s = time.perf_counter() - started
        print(
            f"  stored {responses:,} responses ({3 * responses:,} indexed items) in {fill_s:.1f} s"
        )
        rng = random.Random(18)
        outputs = [o for _, outs in stored for o in outs]
        inputs = [i for i, _ in stored]

        def refs(ids: list[str]) -> list[dict[str, Any]]:
            return [{"type": "item_reference", "id": i} for i in ids]

        async def one_output() -> None:
            ref = rng.choice(outputs)
            found = await item_refs.resolve(store, _PROJECT, refs([ref]))
            assert ref in found

        async def six() -> None:
            ids = rng.sample(outputs, 6)
            found = await item_refs.resolve(store, _PROJECT, refs(ids))
            assert all(i in found for i in ids)

        async def one_input() -> None:
            ref = rng.choice(inputs)
            assert ref in await item_refs.resolve(store, _PROJECT, refs([ref]))

        async def missing() -> None:
            ref = "msg_" + secrets.token_hex(24)
            assert ref not in await item_refs.resolve(store, _PROJECT, refs([ref]))

        held: list[str] = []  # items added through the conversation items API
        for n in range(1000):
            conversation = ConversationRow(new_id("conv"), _PROJECT, n)
            items = [
                {
                    "id": new_id("msg"),
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                }
                for _ in range(2)
            ]
            await store.conversations.create(conversation, items)
            held.extend(item["id"] for item in items)

        async def one_conversation_item() -> None:
            ref = rng.choice(held)
            assert ref in await item_refs.resolve(store, _PROJECT, refs([ref]))

        last = new_id("resp")
        await store.create_response(
            NewResponse(last, "bench", 0, None, False, {"model": "bench"}, [], project=_PROJECT)
        )

        async def chain() -> None:
            assert len(await store.load_chain(last, project=_PROJECT)) == 1

        return {
            "one output item": await _timings(one_output),
            "six items (one query)": await _timings(six),
            "one input item": await _timings(one_input),
            "one conversation item": await _timings(one_conversation_item),
            "a missing id (both indexes)": await _timings(missing),
            "chain look-up (for scale)": await _timings(chain),
        }
    finally:
        await store.close()


async def _with_postgres(responses: int) -> dict[str, tuple[float, float]]:
    name = f"bench_item_refs_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(_ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base = _ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    try:
        return await measure(f"{base}/{name}", responses)
    finally:
        admin = await asyncpg.connect(_ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=100_000)
    parser.add_argument(
        "--postgres", action="store_true", help="a database of its own on PostgreSQL"
    )
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            kind, results = "PostgreSQL", await _with_postgres(args.responses)
        else:
            url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'item_refs.db'}"
            kind, results = url.split(":", 1)[0], await measure(url, args.responses)
    print(
        f"\n{kind}, {args.responses:,} stored responses: item_reference look-ups (app.item_refs.resolve)\n"
    )
    print("| look-up | median (ms) | p99 (ms) |")
    print("|---|--:|--:|")
    for name, (median, p99) in results.items():
        print(f"| {name} | {median:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    asyncio.run(main())

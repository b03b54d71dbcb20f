"""Conversation history lookups: what ``conversation`` on ``POST /v1/responses`` costs before
generation, and a page of ``/v1/conversations/{id}/items``.

``python -m bench.conversations [--database-url URL] [--others 10,100000]``

For each count of *other* responses stored (each a small, finished log), it also stores a tenth
as many other conversations of 10 items each, and one conversation of 50 turns (a user message
and an assistant answer each, 100 items, 5 of them deleted), then times through the store and
the service layer (what the HTTP handlers call, without HTTP):

- the history lookup: the items the conversation holds now (``ConversationStore.items``);
- the history as a response gets it: the lookup plus rendering it into the prompt (Harmony);
- a page of 20 items after the 50th, newest first (``list_items``).

Medians of 20 runs each, in milliseconds. Target (issue 18): the lookup under 5 ms with 100,000
responses stored, not growing with the number stored.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.ids import new_id
from app.reasoning_crypto import ReasoningCipher, new_key
from app.service import ResponseService
from app.settings import Settings
from app.wire import CreateResponse
from bench.reads import _store_response
from persistence.conversations import ConversationRow
from persistence.sql import open_store

_PROJECT = "default"


def _message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": new_id("msg"),
        "role": role,
        "status": "completed",
        "content": [{"type": part, "text": text}],
    }


async def _median_ms(fn: Any, runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def _measure(url: str, others: int) -> dict[str, float]:
    store = await open_store(url)
    try:
        batch = []
        for i in range(others):
            batch.append(_store_response(store, None, 3, f"other {i}"))
            if len(batch) == 256:
                await asyncio.gather(*batch)
                batch = []
        await asyncio.gather(*batch)
        conversations = store.conversations
        for i in range(others // 10):
            row = ConversationRow(new_id("conv"), _PROJECT, 0, {})
            await conversations.create(row, [_message("user", f"other {i} {n}") for n in range(10)])
        row = ConversationRow(new_id("conv"), _PROJECT, 0, {})
        await conversations.create(row, [])
        for turn in range(50):
            await conversations.append(
                row.id,
                _PROJECT,
                [_message("user", f"question {turn}"), _message("assistant", f"answer {turn}")],
            )
        items = await conversations.items(row.id, _PROJECT)
        for item in items[10:60:10]:
            await conversations.delete_item(row.id, _PROJECT, item["id"])
        middle = items[51]["id"]
        enc = load_encoding()
        service = ResponseService(
            Settings(engine="echo"),
            store,
            EchoEngine(enc, ["bench"]),
            enc,
            ReasoningCipher(new_key()),
        )
        request = CreateResponse(model="bench", input="next")

        async def lookup() -> None:
            assert len(await conversations.items(row.id, _PROJECT)) == 95

        async def history() -> None:
            found = await service.conversations.history(row.id, _PROJECT)
            await service.prompts.render(request, found, [])

        async def page() -> None:
            listed, more = await conversations.list_items(
                row.id, _PROJECT, after=middle, limit=20, order="desc"
            )
            assert len(listed) == 20 and more

        return {
            "lookup_ms": await _median_ms(lookup),
            "history_ms": await _median_ms(history),
            "page_ms": await _median_ms(page),
        }
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: a fresh SQLite file per count")
    parser.add_argument("--others", default="10,100000")
    args = parser.parse_args()
    print(
        "| other responses stored | history lookup, 95 items (ms) "
        "| lookup + rendered into the prompt (ms) | a page of 20 items (ms) |"
    )
    print("|--:|--:|--:|--:|")
    for others in (int(n) for n in args.others.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'conversations.db'}"
            r = await _measure(url, others)
        print(f"| {others:,} | {r['lookup_ms']:.2f} | {r['history_ms']:.2f} | {r['page_ms']:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())

"""Read-path timings: GET of a long response, a long previous_response_id chain, and resume.

``python -m bench.reads [--database-url URL] [--others 10,100000] [--turn-words 20] [--analyze]``

For each count of *other* responses stored (each a small, finished log), it stores one response
of 10,000 events and a 50-turn ``previous_response_id`` chain, then times through the service
layer (what the HTTP handlers call, without HTTP):

- ``GET`` of the 10,000-event response (``ResponseService.get``);
- rebuilding the 50-turn chain into a prompt (loading the chain's logs, replaying them as input
  items, rendering Harmony: everything ``previous_response_id`` costs before generation), cold
  (no message rendered before, as after a restart) and with its messages rendered before (as
  when this server served the earlier turns: they are looked up, see ``domain.prompt``);
- the chain's read alone (``load_chain``: the store's part of the rebuild);
- resume: the time to the first bytes of ``stream(id, after=5000)`` on the long response.

``--turn-words``: the words of each turn's answer (one delta event each); ``--analyze``: run
``ANALYZE`` once the data is stored, as an operator's maintenance (or PostgreSQL's autovacuum)
does, so the planners see the statistics a database in service has.

Medians of 20 runs each, in milliseconds. Targets (issue 9): GET < 20 ms, chain < 50 ms,
resume start < 10 ms, none growing with the number of responses stored.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.ids import new_id
from app.reasoning_crypto import ReasoningCipher, new_key
from app.service import ResponseService
from app.settings import Settings
from app.wire import CreateResponse
from domain.builder import ResponseBuilder, Usage
from domain.projections import payload, payload_json
from domain.prompt import forget_rendered
from persistence.records import NewResponse, StoredEvent
from persistence.sql import open_store


def _skeleton(response_id: str, previous: str | None) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "model": "bench",
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "previous_response_id": previous,
    }


def _log(response_id: str, previous: str | None, words: int) -> list[StoredEvent]:
    counter = itertools.count()
    b = ResponseBuilder(_skeleton(response_id, previous), new_id=lambda p: f"{p}_{next(counter)}")
    b.created()
    b.in_progress()
    b.open_message()
    for _ in range(words):
        b.append(" word")
    b.finish("completed", usage=Usage(1, 0, words, 0), completed_at=1)
    return [StoredEvent(e.sequence_number, e.type, payload(e), payload_json(e)) for e in b.take()]


async def _store_response(store: Any, previous: str | None, words: int, text: str) -> str:
    response_id = new_id("resp")
    await store.create_response(
        NewResponse(
            id=response_id,
            model="bench",
            created_at=0,
            previous_response_id=previous,
            background=False,
            request={"model": "bench", "input": text},
            input_items=[
                {
                    "id": new_id("msg"),
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                }
            ],
        )
    )
    await store.append(response_id, _log(response_id, previous, words), 0)
    return response_id


async def _median_ms(fn: Any, runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def _analyze(url: str) -> None:
    if url.startswith("sqlite"):
        con = sqlite3.connect(url.split("///", 1)[1])
        try:
            con.execute("ANALYZE")
        finally:
            con.close()
        return
    pg = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await pg.execute("ANALYZE")
    finally:
        await pg.close()


async def _measure(
    url: str, others: int, turn_words: int = 20, analyze: bool = False
) -> dict[str, float]:
    store = await open_store(url)
    try:
        batch = []
        for i in range(others):
            batch.append(_store_response(store, None, 3, f"other {i}"))
            if len(batch) == 256:
                await asyncio.gather(*batch)
                batch = []
        await asyncio.gather(*batch)
        long_id = await _store_response(store, None, 10_000 - 8, "a long one")
        tip = None
        for turn in range(50):
            tip = await _store_response(store, tip, turn_words, f"turn {turn}")
        assert tip is not None
        if analyze:
            await _analyze(url)
        enc = load_encoding()
        service = ResponseService(
            Settings(engine="echo"),
            store,
            EchoEngine(enc, ["bench"]),
            enc,
            ReasoningCipher(new_key()),
        )
        request = CreateResponse(model="bench", input="next", previous_response_id=tip)

        async def get() -> None:
            response = await service.get(long_id)
            assert response["status"] == "completed"

        async def chain() -> None:
            await service.prompts.prompt(request, "default")

        async def chain_cold() -> None:  # no message rendered before (a restarted server)
            forget_rendered()
            await chain()

        async def chain_read() -> None:
            assert len(await store.load_chain(tip)) == 50

        async def resume() -> None:
            stream = service.stream(long_id, 5000)
            first = await anext(stream)
            assert first.startswith(b"event: ")
            await stream.aclose()

        return {
            "get_ms": await _median_ms(get),
            "chain_cold_ms": await _median_ms(chain_cold),
            "chain_ms": await _median_ms(chain),
            "chain_read_ms": await _median_ms(chain_read),
            "resume_ms": await _median_ms(resume),
        }
    finally:
        await store.close()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: a fresh SQLite file per count")
    parser.add_argument("--others", default="10,100000")
    parser.add_argument("--turn-words", type=int, default=20)
    parser.add_argument("--analyze", action="store_true")
    args = parser.parse_args(argv)
    print(
        "| other responses stored | GET 10,000 events (ms) | 50-turn chain rebuilt, cold (ms) "
        "| the same, messages rendered before (ms) | the chain's read (ms) | resume start (ms) |"
    )
    print("|--:|--:|--:|--:|--:|--:|")
    for others in (int(n) for n in args.others.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'reads.db'}"
            r = await _measure(url, others, args.turn_words, args.analyze)
        print(
            f"| {others:,} | {r['get_ms']:.2f} | {r['chain_cold_ms']:.2f} | {r['chain_ms']:.2f} "
            f"| {r['chain_read_ms']:.2f} | {r['resume_ms']:.2f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())

"""The audit page of a long response: ``GET /ui/responses/{id}`` of a 10,000-event log.

``python -m bench.ui_page [--events 10000] [--runs 10] [--others 1000]``

Stores (SQLite file) ``--others`` small finished responses and one of ``--events`` events with its
audit records (about 1,000 prompt token ids, one output token id per text delta), in two shapes:
one commit per event (a paced engine: the timeline has a point per event), and commits of 100
events (a fast one). Then serves it (a real server, the echo engine) and times the page over
loopback HTTP: the store reads, the timeline, the template, the transfer. Medians of ``--runs``
GETs after one warm-up, in milliseconds, and the page's size. Target (issue 19): at most 500 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.settings import Settings
from bench.reads import _log, _store_response
from persistence.records import AuditRecord, NewResponse
from persistence.sql import open_store
from tests.support.server import serve


async def _fill(url: str, events: int, per_commit: int, others: int) -> str:
    clock = itertools.count(1_800_000_000.0, 0.02)  # 20 ms between commits
    store = await open_store(url)
    try:
        store._clock = lambda: next(clock)  # commit times a paced engine would have made
        for start in range(0, others, 256):
            await asyncio.gather(
                *(
                    _store_response(store, None, 3, f"other {i}")
                    for i in range(start, min(others, start + 256))
                )
            )
        log = _log("resp_long", None, events - 8)
        await store.create_response(
            NewResponse(
                id="resp_long",
                model="bench",
                created_at=1_800_000_000,
                previous_response_id=None,
                background=False,
                request={"model": "bench", "input": "a long one"},
                input_items=[
                    {
                        "id": "msg_in",
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "a long one"}],
                    }
                ],
            )
        )
        await store.append_audit(
            "resp_long", [AuditRecord("prompt_token_ids", tuple(range(200_000, 201_000)))]
        )
        for start in range(0, len(log), per_commit):
            await store.append("resp_long", log[start : start + per_commit], start)
        await store.append_audit(
            "resp_long",
            [
                AuditRecord("output_token_ids", tuple(i % 200_000 for i in range(events - 8))),
                AuditRecord("finish", detail={"finish_reason": "stop"}),
            ],
        )
        return "resp_long"
    finally:
        await store.close()


def _time_page(url: str, response_id: str, runs: int) -> dict[str, Any]:
    settings = Settings(engine="echo", database_url=url, served_model_names=("bench",))
    with serve(settings) as server, httpx.Client(base_url=server.base_url, timeout=60) as http:
        first = http.get(f"/ui/responses/{response_id}")
        first.raise_for_status()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            page = http.get(f"/ui/responses/{response_id}")
            times.append((time.perf_counter() - start) * 1000)
            assert page.status_code == 200 and response_id in page.text
        listing = []
        for _ in range(runs):
            start = time.perf_counter()
            http.get("/ui", params={"q": "other 99"}).raise_for_status()
            listing.append((time.perf_counter() - start) * 1000)
    return {
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "kib": len(first.content) / 1024,
        "list_ms": statistics.median(listing),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--others", type=int, default=1_000)
    args = parser.parse_args()
    print(
        f"| shape ({args.events:,} events, {args.others:,} other responses) | page median (ms) "
        "| page max (ms) | page size (KiB) | list, text filter (ms) |"
    )
    print("|---|--:|--:|--:|--:|")
    for per_commit in (1, 100):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite+aiosqlite:///{Path(tmp) / 'ui.db'}"
            response_id = asyncio.run(_fill(url, args.events, per_commit, args.others))
            r = _time_page(url, response_id, args.runs)
        print(
            f"| {per_commit} event(s) a commit | {r['median_ms']:.1f} | {r['max_ms']:.1f} "
            f"| {r['kib']:.0f} | {r['list_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()

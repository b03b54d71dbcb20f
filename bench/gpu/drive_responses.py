"""Drive a running responses-ledger server with concurrent streamed ``POST /v1/responses``.

Made for a model with random weights (``--load-format dummy``): its output is random tokens, so
the Harmony decoder turns most of it into one recovered message at the end and the response ends
``incomplete`` (``max_output_tokens``), not ``completed``. Throughput therefore counts the engine's
output tokens as the server reports them (``response.usage.output_tokens`` of the terminal event),
not delta events, and every terminal type is accepted and tallied.

    python bench/gpu/drive_responses.py --url http://127.0.0.1:8000 --model gpt-oss-20b \\
        --concurrency 1,16,64,256 --tokens 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter

import httpx

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")


async def one_stream(
    client: httpx.AsyncClient, url: str, body: dict
) -> tuple[int, int, float, str]:
    """(output tokens, events, seconds to the first event after in_progress, terminal type)."""
    sent = time.perf_counter()
    events, first, terminal, output_tokens = 0, None, "none", 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            event = json.loads(line[6:])
            kind = event.get("type", "")
            if first is None and kind not in ("response.created", "response.in_progress"):
                first = time.perf_counter() - sent
            if kind in TERMINAL:
                terminal = kind
                usage = (event.get("response") or {}).get("usage") or {}
                output_tokens = int(usage.get("output_tokens") or 0)
    return output_tokens, events, first if first is not None else float("nan"), terminal


async def _worker(
    client: httpx.AsyncClient, url: str, body: dict, streams: int
) -> list[tuple[int, int, float, str]]:
    """One connection's worth of load: ``streams`` streams, one after the other."""
    return [await one_stream(client, url, body) for _ in range(streams)]


async def run(args: argparse.Namespace) -> list[dict]:
    url = args.url.rstrip("/") + "/v1/responses"
    body = {
        "model": args.model,
        "input": args.input,
        "stream": True,
        "max_output_tokens": args.tokens,
        "store": not args.no_store,
    }
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    rows = []
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        await one_stream(client, url, body)  # warm-up
        for concurrency in args.concurrency:
            start = time.perf_counter()
            per_worker = await asyncio.gather(
                *(_worker(client, url, body, args.streams) for _ in range(concurrency))
            )
            flat = [result for results in per_worker for result in results]
            seconds = time.perf_counter() - start
            tokens = sum(r[0] for r in flat)
            row = {
                "concurrency": concurrency,
                "streams": len(flat),
                "seconds": round(seconds, 3),
                "output_tokens": tokens,
                "output_tokens_per_s": round(tokens / seconds, 1),
                "events_per_s": round(sum(r[1] for r in flat) / seconds, 1),
                "first_event_ms_p50": round(statistics.median(r[2] for r in flat) * 1000, 1),
                "terminals": dict(Counter(r[3] for r in flat)),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="gpt-oss-20b")
    parser.add_argument("--input", default="Write a long story.")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64]
    )
    parser.add_argument("--tokens", type=int, default=256, help="max_output_tokens per stream")
    parser.add_argument("--streams", type=int, default=1, help="streams per concurrent worker")
    parser.add_argument("--no-store", action="store_true", help="send store=false")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args))
    print("\n| C | streams | s | output tokens/s | events/s | first event p50 ms | terminals |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['streams']} | {r['seconds']} | {r['output_tokens_per_s']} "
            f"| {r['events_per_s']} | {r['first_event_ms_p50']} | {r['terminals']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

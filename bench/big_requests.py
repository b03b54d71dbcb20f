"""Do large valid requests stall the other streams? (issue 14, point 5)

    python -m bench.big_requests                       # 32 streams, 8 MB and 16 MB requests
    python -m bench.big_requests --streams 32 --seconds 10 --sizes 8000000,16000000

Starts ``responses-ledger serve`` (scripted engine, tokens paced ``--token-delay-ms`` apart, a
fresh SQLite database) in a process of its own, then runs two phases of ``--seconds`` each:

- *without*: ``--streams`` concurrent streams, each restarted as soon as it ends;
- *with*: the same streams while one client thread posts large valid requests back to back
  (an ``input`` string of ``--sizes`` bytes, cycled; non-streaming, so each waits for its
  completion).

For every stream it records when each SSE event arrived and prints the p50, p99 and max gap
between consecutive events of one stream, for both phases, and each large request's status and
latency. The paced engine sends a token every ``--token-delay-ms``, so that is the gap an
unstalled server shows; a stall of the event loop shows up directly as a larger max gap.
The large bodies are built before the phases start, so building them costs the client nothing
while it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import _free_port, _Server
from bench.stats import percentile
from bench.targets import LEDGER_MODEL, REPO_ROOT, ledger_script

__all__ = ["main"]

HOST = "127.0.0.1"


def _big_body(size: int) -> bytes:
    """A valid request whose JSON is ``size`` bytes (within a few): plain words as its input."""
    head = json.dumps({"model": LEDGER_MODEL, "input": ""})[:-2]  # ... "input": "
    filler = "hello world "
    room = size - len(head) - 2  # the closing quote and brace
    text = (filler * (room // len(filler) + 1))[:room]
    return f'{head}{text}"}}'.encode()


async def _stream_forever(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    stop: asyncio.Event,
    gaps: list[float],
) -> int:
    """Run streams one after another until ``stop``; append every inter-event gap (seconds)."""
    streams = 0
    while not stop.is_set():
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(
                    f"stream answered {response.status_code}: {await response.aread()!r}"
                )
            last: float | None = None
            async for chunk in response.aiter_raw():
                now = time.perf_counter()
                events = chunk.count(b"\n\n")
                if not events:
                    continue
                if last is not None:
                    gaps.append(now - last)
                gaps.extend([0.0] * (events - 1))  # arrived together with the first
                last = now
        streams += 1
    return streams


def _post_big(
    url: str, bodies: list[bytes], stop: threading.Event, results: list[tuple[int, int, float]]
) -> None:
    with httpx.Client(timeout=300) as client:
        i = 0
        while not stop.is_set():
            body = bodies[i % len(bodies)]
            i += 1
            start = time.perf_counter()
            r = client.post(url, content=body, headers={"content-type": "application/json"})
            results.append((len(body), r.status_code, time.perf_counter() - start))
            if r.status_code != 200 and len(results) == 1:
                print(f"a large request answered {r.status_code}: {r.text[:300]}")


async def _phase(
    base: str, streams: int, seconds: float, bodies: list[bytes] | None
) -> dict[str, Any]:
    url = base + "/v1/responses"
    body = {"model": LEDGER_MODEL, "input": "Write a long story.", "stream": True}
    stop = asyncio.Event()
    gaps: list[float] = []
    big: list[tuple[int, int, float]] = []
    big_stop = threading.Event()
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks = [
            asyncio.create_task(_stream_forever(client, url, body, stop, gaps))
            for _ in range(streams)
        ]
        await asyncio.sleep(1.0)  # every stream under way before measuring
        gaps.clear()
        sender = None
        if bodies:
            sender = threading.Thread(
                target=_post_big, args=(url, bodies, big_stop, big), daemon=True
            )
            sender.start()
        await asyncio.sleep(seconds)
        big_stop.set()
        if sender is not None:
            await asyncio.to_thread(sender.join)  # the request in flight finishes
        measured = list(gaps)
        stop.set()
        done = await asyncio.gather(*tasks)
    return {"gaps": measured, "streams": sum(done), "big": big}


def _report(name: str, result: dict[str, Any]) -> None:
    gaps_ms = [g * 1000 for g in result["gaps"]]
    print(
        f"{name:8s} events {len(gaps_ms):7d}  gap p50 {percentile(gaps_ms, 0.5):7.1f} ms  "
        f"p99 {percentile(gaps_ms, 0.99):7.1f} ms  max {max(gaps_ms, default=float('nan')):7.1f} ms  "
        f"(streams finished: {result['streams']})"
    )
    for size, status, seconds in result["big"]:
        print(f"         big request {size / 1e6:5.1f} MB -> {status} in {seconds:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--token-delay-ms", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=200, help="deltas per stream")
    parser.add_argument(
        "--sizes", default="8000000,16000000", help="bytes of each large request, cycled"
    )
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    args = parser.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",") if s]
    bodies = [_big_body(size) for size in sizes]
    with tempfile.TemporaryDirectory(prefix="big-requests-") as tmp:
        workdir = Path(tmp)
        script = ledger_script(workdir, args.tokens, args.token_delay_ms)["script"]
        port = _free_port()
        database_url = args.database_url or f"sqlite+aiosqlite:///{workdir / 'responses.db'}"
        argv_ = [
            sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
            "serve", "--engine", "scripted", "--script", script, "--database-url", database_url,
            "--host", HOST, "--port", str(port),
        ]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "RESPONSES_LEDGER_LOG_LEVEL": "warning",
            "RESPONSES_LEDGER_MAX_BODY_BYTES": str(max([16 * 1024 * 1024, *sizes])),
        }
        server = _Server(argv_, env, workdir / "server.log")
        try:
            server.wait_ready(port, 120)
            base = f"http://{HOST}:{port}"
            deadline = time.monotonic() + 60
            while httpx.get(base + "/health").status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server never became ready")
                time.sleep(0.1)
            print(
                f"{args.streams} streams of {args.tokens} tokens, {args.token_delay_ms} ms apart; "
                f"{args.seconds} s per phase; large requests: {', '.join(f'{s / 1e6:.1f} MB' for s in sizes)}"
            )
            _report("without", asyncio.run(_phase(base, args.streams, args.seconds, None)))
            _report("with", asyncio.run(_phase(base, args.streams, args.seconds, bodies)))
        finally:
            tail = server.log_tail(3000)
            server.stop()
            if "Traceback" in tail:
                print("server log:\n" + tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

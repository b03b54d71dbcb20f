"""What checking an API key costs a request (target: at most 50 us, with verified hashes cached).

Usage: ``python -m bench.key_check [--requests 50000] [--reps 5]``. Prints the median over
``reps`` of, per request:

- ``authenticate``: ``KeyRing.authenticate`` for a key whose hash is cached (hash the key,
  look it up, check its expiry), and for the static key (hash + ``compare_digest``);
- ``middleware``: the whole ``app.auth.KeyAuth`` middleware (header parsing, the key, the
  rate counter, the caller put in the scope, the release list) around an ASGI app that does
  nothing, minus the same stack run open (no key required): what keys add to a request;
- ``browser guard``: ``app.browser.BrowserGuard`` on the same request, for reference;
- ``uncached``: a key looked up in a SQLite database each time (cache off), for reference: what
  a request pays once per key per ``RESPONSES_LEDGER_KEY_CACHE_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.auth import KeyAuth
from app.browser import BrowserGuard
from app.keys import KeyRing, create_key
from app.limits import KeyLimits
from persistence.memory import MemoryStore
from persistence.sql import open_store


async def _noop(scope: Any, receive: Any, send: Any) -> None:
    return None


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: Any) -> None:
    return None


def _scope(app: Any, key: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": "/v1/models",
        "app": app,
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"user-agent", b"OpenAI/Python 1.99.0"),
            (b"accept", b"application/json"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
        ],
    }


async def _per_call_us(n: int, call: Any) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await call()
    return (time.perf_counter() - start) / n * 1e6


async def _measure(n: int) -> dict[str, float]:
    store = MemoryStore()
    _, key = await create_key(store, project="bench", requests_per_minute=10**9)
    ring = KeyRing(store, required=True, static_key="static-bench-key", cache_s=3600)
    open_ring = KeyRing(store, required=False)
    assert await ring.authenticate(key) is not None  # cached from now on

    figures = {
        "authenticate, cached key": await _per_call_us(n, lambda: ring.authenticate(key)),
        "authenticate, static key": await _per_call_us(
            n, lambda: ring.authenticate("static-bench-key")
        ),
    }
    keyed_app = SimpleNamespace(state=SimpleNamespace(keys=ring, limits=KeyLimits()))
    open_app = SimpleNamespace(state=SimpleNamespace(keys=open_ring, limits=KeyLimits()))
    auth = KeyAuth(_noop)
    keyed = _scope(keyed_app, key)
    opened = _scope(open_app, key)

    async def with_key() -> None:
        await auth(dict(keyed), _receive, _send)

    async def run_open() -> None:
        await auth(dict(opened), _receive, _send)

    with_key_us = await _per_call_us(n, with_key)
    open_us = await _per_call_us(n, run_open)
    figures["middleware with a key (whole)"] = with_key_us
    figures["middleware run open (whole)"] = open_us
    figures["middleware: what the key adds"] = with_key_us - open_us
    guard = BrowserGuard(_noop, hosts=("localhost", "127.0.0.1", "::1"), origins=())
    figures["browser guard (whole)"] = await _per_call_us(
        n, lambda: guard(dict(keyed), _receive, _send)
    )
    return figures


async def _uncached(n: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite+aiosqlite:///{Path(tmp) / 'keys.db'}")
        try:
            _, key = await create_key(store, project="bench")
            ring = KeyRing(store, required=True, cache_s=0)
            await ring.authenticate(key)
            return await _per_call_us(n, lambda: ring.authenticate(key))
        finally:
            await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--uncached-requests", type=int, default=500)
    args = parser.parse_args()
    runs = [await _measure(args.requests) for _ in range(args.reps)]
    print(f"key check, median of {args.reps} x {args.requests} requests (us per request)")
    for name in runs[0]:
        print(f"  {name:<36} {statistics.median(run[name] for run in runs):8.2f}")
    uncached = statistics.median([await _uncached(args.uncached_requests) for _ in range(3)])
    print(f"  {'authenticate, uncached (SQLite read)':<36} {uncached:8.2f}")
    print("target: the key check <= 50 us per request")


if __name__ == "__main__":
    asyncio.run(main())

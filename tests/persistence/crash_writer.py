"""Writes to a store until it is killed, for ``test_durability``.

    python -m tests.persistence.crash_writer DATABASE_URL RESPONSES

Starts RESPONSES responses and appends to all of them concurrently, one to three events at a
time, printing ``<response id> <seq>`` for the last event of each append once ``append`` has
returned (that is, once the store said it is durable). The test kills it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys

from persistence.sql import SqlStore, open_store
from tests.persistence.factories import created, delta, new_response


async def _write(store: SqlStore, rid: str) -> None:
    await store.append(rid, [created(rid)], 0)
    print(rid, 0, flush=True)
    seq = 1
    while True:
        events = [delta(seq + i, "tok ") for i in range(1 + seq % 3)]
        await store.append(rid, events, seq)
        seq += len(events)
        print(rid, seq - 1, flush=True)


async def main(url: str, responses: int) -> None:
    store = await open_store(url, commit_window_ms=2.0)
    rids = []
    for _ in range(responses):
        new = new_response()
        await store.create_response(new)
        rids.append(new.id)
    await asyncio.gather(*(_write(store, rid) for rid in rids))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))

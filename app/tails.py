"""Followers of logs that another process writes: one query for all those woken together.

A follower on this replica of a response another replica generates (a resume through a load
balancer, a cancel waiting for its terminal event) sleeps on the doorbell and reads the log when
it rings. The writer rings every log of a commit at once, so the followers of those logs wake in
the same loop turn; a query each would cost this replica one round trip and one result parse per
follower per commit (64 followers of streams paced at 15 ms a token: over 4,000 queries a
second, which saturated a core and put the lag in hundreds of milliseconds). :class:`TailReads`
gathers the reads asked in one loop turn (and while a read is in flight) into one
``store.load_after`` for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib

from persistence.records import StoredEvent
from persistence.store import EventStore

__all__ = ["TailReads"]


class TailReads:
    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._pending: dict[str, list[tuple[int, asyncio.Future[list[StoredEvent]]]]] = {}
        self._task: asyncio.Task[None] | None = None
        #: Totals since start: reads asked, queries made (the batching's effect).
        self.reads = 0
        self.queries = 0

    async def read(self, response_id: str, after: int) -> list[StoredEvent]:
        """``response_id``'s events after ``after``, read with the others asked meanwhile.
        Raises what the store raised."""
        future: asyncio.Future[list[StoredEvent]] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(response_id, []).append((after, future))
        self.reads += 1
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="app.tails")
        return await future

    async def _run(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(0)  # the other followers woken in this turn join
                pending, self._pending = self._pending, {}
                afters = {rid: min(after for after, _ in asks) for rid, asks in pending.items()}
                self.queries += 1
                try:
                    found = await self._store.load_after(afters)
                except BaseException as exc:
                    for asks in pending.values():
                        for _, future in asks:
                            if not future.done():
                                future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for rid, asks in pending.items():
                    events = found.get(rid, [])
                    for after, future in asks:
                        if not future.done():
                            future.set_result([e for e in events if e.seq > after])
        finally:
            self._task = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

"""Group commit: many writers, one transaction per short window.

Streaming a response appends an event per token, and a commit costs an fsync (SQLite) or a
round trip and a WAL flush (PostgreSQL). So writes are queued and a single task flushes the
queue in batches: it waits ``window_s`` after the first write of a batch (less if the batch is
already ``max_batch`` heavy, or none at all while closing; with no window, one turn of the event
loop, so writes made by tasks already scheduled join), then hands everything pending to
``flush``. While a flush runs, new writes pile up and form the next batch, so under load the
batch size grows with the commit latency instead of the number of commits.

A batch that piled up while the previous flush ran goes as soon as that flush ends (after one
loop turn, so the writers it released can add what they held back): the flush was its window.

``flush`` owns the outcome of every item it receives and resolves each item's future. If it
raises anyway, the items still pending are failed with ``StoreError`` so no caller waits for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from persistence.errors import StoreError

__all__ = ["GroupCommit", "Outcome", "Pending"]

_log = logging.getLogger(__name__)


class Outcome(Protocol):
    """How a queued write's outcome is reported: an ``asyncio.Future``, or anything that settles
    the same way (a callback's stand-in)."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class Pending(Protocol):
    @property
    def future(self) -> Outcome: ...


P = TypeVar("P", bound=Pending)


class GroupCommit(Generic[P]):
    def __init__(
        self,
        flush: Callable[[list[P]], Awaitable[None]],
        *,
        window_s: float,
        max_batch: int,
    ) -> None:
        if window_s < 0 or max_batch < 1:
            raise ValueError("window_s must be >= 0 and max_batch >= 1")
        self._flush = flush
        self._window_s = window_s
        self._max_batch = max_batch
        self._pending: list[P] = []
        self._weight = 0
        self._first_at = 0.0
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: When the first write of the batch being flushed was queued (``loop.time()``): a
        #: commit's latency as its writers see it is measured from it (``app.metrics``).
        self.batch_first_at = 0.0

    def put(self, item: P, weight: int = 1) -> None:
        """Queue ``item``; its future resolves when ``flush`` has dealt with it."""
        if self._closing:
            raise StoreError("the store is closed")
        pending = self._pending
        if not pending:
            # the first of a batch: the commit task waits for one only while none is pending
            loop = asyncio.get_running_loop()
            self._first_at = loop.time()
            self._wake.set()
            if self._task is None:
                self._task = loop.create_task(self._run(), name="persistence.group_commit")
        pending.append(item)
        self._weight += weight
        if self._weight >= self._max_batch:
            self._full.set()

    async def close(self) -> None:
        """Flush what is queued, then stop; later ``put`` calls raise ``StoreError``."""
        self._closing = True
        self._wake.set()
        self._full.set()
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[P] = []
        # True right after a flush: what is pending then was written during that commit, which
        # was a window long enough; it goes now, not one more window later.
        carried = False
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    carried = False
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                delay = self._first_at + self._window_s - loop.time()
                if not carried and not self._closing and self._weight < self._max_batch:
                    if delay > 0:
                        self._full.clear()
                        try:
                            async with asyncio.timeout(delay):
                                await self._full.wait()
                        except TimeoutError:
                            pass
                    else:
                        # No window (left): still one loop turn, for the tasks already scheduled
                        # in this one (a new response's generation task queues its first events
                        # and its prompt audit right behind the response row).
                        await asyncio.sleep(0)
                batch, self._pending, self._weight = self._pending, [], 0
                self.batch_first_at = self._first_at
                try:
                    await self._flush(batch)
                except Exception as exc:
                    _log.exception("group commit flush failed")
                    _fail(batch, f"commit failed: {exc!r}", exc)
                batch = []
                # One loop turn for the writers this commit just released (their futures'
                # callbacks) to queue what they held back while it ran.
                await asyncio.sleep(0)
                carried = True
        except asyncio.CancelledError:
            self._closing = True
            _fail(batch, "the store's commit task was cancelled", None)
            _fail(self._pending, "the store's commit task was cancelled", None)
            self._pending = []
            raise


def _fail(items: list[P], message: str, cause: BaseException | None) -> None:
    for item in items:
        if not item.future.done():
            error = StoreError(message)
            error.__cause__ = cause
            item.future.set_exception(error)

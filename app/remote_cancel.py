"""Cancel from any replica: a cancel asked of a response that another replica is generating.

The replica that gets the cancel records it in the database (``responses.cancel_requested_at``)
and rings the owner's doorbell channel (its replica id). Every replica listens on its own
channel (:meth:`RemoteCancels.watch`, a background task); when it rings (or every few seconds,
in case a ring was lost) it asks the store which of its responses someone wants cancelled and
cancels those it is generating, exactly as a local cancel does: the engine is aborted and the
log ends ``response.cancelled``. The asking replica meanwhile follows the log to its terminal
event and answers with the cancelled Response. A response whose owner died before acting on it
is cancelled by the replica that takes it over (``app.takeover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from persistence.doorbell import Doorbell
from persistence.errors import StoreError
from persistence.store import EventStore

__all__ = ["RemoteCancels"]

log = logging.getLogger(__name__)

#: How often the owner looks for cancel requests when no ring came (a lost ring delays a
#: cancel by at most this).
_POLL_S = 5.0


class RemoteCancels:
    def __init__(
        self,
        store: EventStore,
        doorbell: Doorbell,
        replica_id: str,
        cancel_local: Callable[[str], Awaitable[bool]],
    ) -> None:
        """``cancel_local(response_id)``: cancel a response this replica is generating (False
        if it is not generating it)."""
        self._store = store
        self._doorbell = doorbell
        self._replica_id = replica_id
        self._cancel_local = cancel_local
        self._task: asyncio.Task[None] | None = None

    async def request(self, response_id: str, owner: str | None) -> bool:
        """Record the cancel and ring the owner; False if the response has ended meanwhile."""
        if not await self._store.request_cancel(response_id):
            return False
        if owner is not None:
            self._doorbell.ring(owner)
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="app.remote_cancel")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        with self._doorbell.listen(self._replica_id) as bell:
            while True:
                await bell.wait(_POLL_S if self._doorbell.connected else 0.5)
                try:
                    wanted = await self._store.cancel_requests(self._replica_id)
                except StoreError as exc:
                    log.warning("cancel requests could not be read (%s); will retry", exc)
                    continue
                for response_id in wanted:
                    try:
                        await self._cancel_local(response_id)
                    except Exception:  # one response's failure must not stop the others'
                        log.exception(
                            "response %s: cancel asked by another replica failed", response_id
                        )

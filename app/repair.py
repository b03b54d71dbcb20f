"""The repair loop: every log ends, even when the database was away when it should have.

A response whose writes the store gave up on (the database stayed unavailable past the store's
retry time, see ``persistence.health``) is *stranded*: its generation stopped, its streams ended
with an ``error`` event, but its log has no terminal event and the database cannot take one
yet. The service hands it here, and this loop, running inside the server, closes it with
``response.failed`` (``store_unavailable``) as soon as the database takes writes again, so a
resumer gets a terminal event and nothing stays ``in_progress`` until some later restart.

The same loop sweeps for orphaned responses every heartbeat (and at once when another replica
releases its lease), whose owner is no longer alive (it was killed, or lost its lease), and hands
each to ``app.takeover`` (claim, then continue or close); start-up recovery ("the server
restarted") is the first sweep, run from the loop when the database could not be written at
start. A task of its own renews this replica's lease every heartbeat (``app.leases``: the
heartbeat is also the probe that tells ``/health`` whether the database takes writes, so it
recovers by itself, after a full disk is freed too).

Closing a log replays what is durable (``ResponseBuilder.resume``: open items are closed first)
and appends the terminal event at the next ``seq``. A stranded response whose row exists but
whose log is empty (its first commit was the one lost) is given its ``response.created`` from
the skeleton the service kept, then the terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from app.leases import live_ids
from app.live import stored_event
from domain.builder import ResponseBuilder
from domain.events import TERMINAL_TYPES
from domain.projections import from_wire
from persistence.errors import StoreUnavailable
from persistence.records import Replica
from persistence.store import EventStore

__all__ = ["STORE_UNAVAILABLE", "Repairs", "store_unavailable_error"]

log = logging.getLogger(__name__)

#: ``error.code`` of a response closed because the database could not take its log.
STORE_UNAVAILABLE = "store_unavailable"
#: How often a healthy store is probed when nothing else wrote (so ``/health`` notices a
#: database that went away while the server was idle).
_IDLE_PROBE_S = 5.0


def store_unavailable_error(retry_s: float) -> dict[str, Any]:
    return {
        "code": STORE_UNAVAILABLE,
        "message": (
            f"The database could not store this response for {retry_s:g} s; "
            "its generation was stopped and what was stored is kept."
        ),
    }


class Repairs:
    """Stranded responses and pending start-up recovery, closed by one background task."""

    def __init__(
        self,
        store: EventStore,
        *,
        interval_s: float,
        new_id: Callable[[str], str],
        is_live: Callable[[str], bool],
        replica: Replica | None = None,
        lease_s: float = 3.0,
        heartbeat_s: float = 1.0,
        take_over: Callable[[str, str | None, str], Awaitable[bool]] | None = None,
        on_replicas: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        """``replica``: this process's identity (``app.leases``); with it the loop renews its
        lease every ``heartbeat_s`` and sweeps every ``lease_s`` for orphaned responses (whose
        owner is not alive), and recovery touches nothing a live replica owns. Without it
        (tests of the loop alone) recovery closes every unfinished response not live here.
        ``take_over(response_id, owner, why)``: what is done with an orphan instead of closing
        it (``app.takeover``: claim it, continue it or close it). ``on_replicas(ids)``: told
        the live replicas (this one among them) that every sweep finds."""
        self._take_over = take_over
        self._on_replicas = on_replicas
        self._store = store
        self._interval_s = interval_s
        self._new_id = new_id
        self._is_live = is_live
        self._replica = replica
        self._lease_s = lease_s
        self._heartbeat_s = heartbeat_s
        self._last_sweep = time.monotonic()
        if replica is not None:
            store.lease(replica, lease_s)
        #: response id -> (its ``error`` when closed, the Response skeleton for an empty log)
        self._stranded: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._recovery_pending = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._beat: asyncio.Task[None] | None = None
        self._last_probe = time.monotonic()

    # -- what the service reports ------------------------------------------------------------

    def strand(self, response_id: str, skeleton: dict[str, Any], error: dict[str, Any]) -> None:
        """``response_id``'s run stopped before its log got a terminal event: close it with
        ``error`` once the database takes writes (at once if it does now)."""
        self._stranded[response_id] = (error, skeleton)
        self._wake.set()

    def stranded(self, response_id: str) -> bool:
        return response_id in self._stranded

    @property
    def pending(self) -> int:
        return len(self._stranded) + self._recovery_pending

    # -- start-up recovery ---------------------------------------------------------------------

    async def recover(self, message: str = "the server restarted") -> list[str]:
        """Close every orphaned log (no terminal event, and no live replica generating it:
        ``response.failed``, ``server_error``, ``message``), closing its open item first. If the
        database cannot be written now, the rest is left to the loop (``pending``)."""
        closed: list[str] = []
        self._recovery_pending = True
        self._last_sweep = time.monotonic()
        owners: list[str] | None = None
        if self._replica is not None:
            owners = live_ids(await self._store.replicas(), self._replica, time.time())
            if self._on_replicas is not None:
                self._on_replicas(owners)
        for response_id in await self._store.unfinished(owned_by_others_than=owners):
            if self._is_live(response_id) or response_id in self._stranded:
                continue
            error = {"code": "server_error", "message": message}
            try:
                if self._take_over is not None:
                    row = await self._store.get(response_id)
                    if row is None or (owners is not None and row.owner in owners):
                        continue  # claimed by a live replica since the query above
                    if not await self._take_over(response_id, row.owner, message):
                        continue
                elif not await self.close(response_id, error, None):
                    continue
            except StoreUnavailable:
                raise
            except Exception:  # a log that cannot be replayed: say so, close the others
                log.exception("response %s: could not be closed at start-up", response_id)
                continue
            closed.append(response_id)
            if self._take_over is None:
                log.warning(
                    "response %s: closed, nobody was generating it (%s)", response_id, message
                )
        self._recovery_pending = False
        return closed

    def schedule_recovery(self) -> None:
        self._recovery_pending = True
        self._wake.set()

    def sweep_now(self) -> None:
        """Sweep for orphans at once (a replica released its lease: its responses wait; or one
        started: this replica learns it is not alone)."""
        self._last_sweep = float("-inf")
        self._wake.set()

    # -- closing one log -----------------------------------------------------------------------

    async def close(
        self, response_id: str, error: dict[str, Any], skeleton: dict[str, Any] | None
    ) -> bool:
        """Append ``response.failed`` with ``error`` to the log, unless it has ended already.
        True if this call closed it. Raises ``StoreError`` if the database failed."""
        stored = await self._store.load(response_id)
        events = [from_wire(e.type, e.seq, e.payload) for e in stored]
        if events and events[-1].type in TERMINAL_TYPES:
            return False
        if events:
            builder = ResponseBuilder.resume(events, new_id=self._new_id)
        elif skeleton is not None and await self._store.get(response_id) is not None:
            builder = ResponseBuilder(dict(skeleton), new_id=self._new_id)
            builder.created(queued=False)
        else:
            return False  # no row, or nothing to rebuild it from
        builder.finish("failed", usage=None, completed_at=int(time.time()), error=error)
        await self._store.append(
            response_id, [stored_event(e) for e in builder.take()], len(events)
        )
        return True

    # -- the loop ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="app.repair")
        if self._replica is not None and self._beat is None:
            self._beat = asyncio.create_task(self._heartbeat(), name="app.repair.heartbeat")

    async def stop(self) -> None:
        for task in (self._task, self._beat):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._beat = None

    async def _heartbeat(self) -> None:
        """The lease's renewal, in a task of its own: a sweep waiting on the database (a claim
        blocked by a frozen owner's locks) must never let this replica's own lease lapse, or
        the others would take over what it has just taken over."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            self._last_probe = time.monotonic()
            try:
                await self._store.probe()
            except Exception:
                log.exception("heartbeat")
            if not self._store.health.failing:
                self._wake.set()  # the sweep is due as often as the heartbeat

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.run_once()
            except Exception:  # never let one bad response stop the loop
                log.exception("repair loop")

    async def run_once(self) -> None:
        """One round: probe the store if it is failing (or idle for a while), then, if it takes
        writes, run pending recovery and close the stranded responses."""
        health = self._store.health
        now = time.monotonic()
        if self._replica is not None:
            # the heartbeat task renews the lease; here only while it has not started (tests
            # drive this method alone)
            due = self._beat is None and now - self._last_probe >= self._heartbeat_s
        else:
            due = now - max(self._last_probe, health.last_ok_at) >= _IDLE_PROBE_S
        if health.failing or due:
            self._last_probe = now
            await self._store.probe()
        if health.failing:
            return
        try:
            if self._recovery_pending:
                await self.recover()
            elif self._replica is not None and now - self._last_sweep >= self._heartbeat_s:
                await self.recover("the server generating it stopped")
            for response_id, (error, skeleton) in list(self._stranded.items()):
                try:
                    closed = await self.close(response_id, error, skeleton)
                except StoreUnavailable:
                    raise
                except Exception:  # refused or broken: retrying cannot help, say so once
                    log.exception("response %s: could not be closed", response_id)
                    closed = False
                if closed:
                    log.warning("response %s: closed after the database came back", response_id)
                self._stranded.pop(response_id, None)
        except StoreUnavailable as exc:
            log.warning("repair: the database failed again (%s); will retry", exc)

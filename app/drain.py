"""Graceful drain: what a replica does between SIGTERM and its exit.

1. It stops taking new responses at once: ``/health/ready`` answers 503 ``draining`` (a load
   balancer takes it out) and ``POST /v1/responses`` answers 503 ``server_draining`` with
   ``Retry-After`` (a balancer may retry it elsewhere: nothing was created). Reads, resumes,
   cancels and deletes are still served.
2. The responses it is generating may finish, for up to ``RESPONSES_LEDGER_DRAIN_S``.
3. Those still running then are handed to the other replicas, if any is alive: their generation
   stops here without a terminal event and this replica releases its lease, which rings the
   others' doorbell: one of them claims each response at once and continues it from the log
   (``app.takeover``). The streams this replica serves go on following the log, so their
   clients see the continuation without noticing, for up to ``DRAIN_S`` again; a stream still
   open after that ends with an ``error`` event (``server_shutting_down``) that says how to
   resume. Alone (no other live replica, or SQLite; frontends of one ``--frontends`` parent
   stopped together count as alone, see ``app.frontends``), the responses end ``response.incomplete``
   with ``incomplete_details.reason`` ``server_shutdown``.
4. Then the server exits (uvicorn's own shutdown: the listening socket closes, the lifespan
   ends).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from app.frontends import group_peers
from app.leases import live_ids

if TYPE_CHECKING:
    from app.service import ResponseService

__all__ = ["SHUTDOWN_REASON", "Drain"]

log = logging.getLogger(__name__)

#: ``incomplete_details.reason`` of a response a lone replica could not finish before it stopped.
SHUTDOWN_REASON = "server_shutdown"


class Drain:
    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        #: Set on SIGTERM: no new responses here.
        self.draining = False
        self._streams_deadline: float | None = None
        self.handed_off = 0

    def streams_over(self) -> bool:
        """Whether the streams following handed-over responses must end now."""
        deadline = self._streams_deadline
        return deadline is not None and time.monotonic() >= deadline

    async def run(self, service: ResponseService) -> None:
        """Drain ``service``; returns when the server may exit."""
        self.draining = True  # no new responses here, and no takeovers (``app.takeover``)
        runs = service.live_runs()
        log.warning(
            "draining: no new responses; %d in flight get up to %g s", len(runs), self.drain_s
        )
        if runs:
            waiters = [asyncio.create_task(run.finished.wait()) for run in runs]
            await asyncio.wait(waiters, timeout=self.drain_s)
            for waiter in waiters:
                waiter.cancel()
        runs = service.live_runs()
        if not runs:
            return
        others: list[str] = []
        try:
            rows = await service.store.replicas()
            # frontends of this process's group stopping with it take nothing over (app.frontends)
            leaving = group_peers(rows, service.replica) | {service.replica.id}
            others = [r for r in live_ids(rows, service.replica, time.time()) if r not in leaving]
        except Exception as exc:  # cannot tell: the responses end here rather than wait for a sweep
            log.warning("draining: the replicas could not be read (%s)", exc)
        if others and service.store_is_shared:
            self.handed_off = len(runs)
            log.warning(
                "draining: handing %d response(s) to %d other replica(s)", len(runs), len(others)
            )
            await service.hand_off(runs)
            self._streams_deadline = time.monotonic() + self.drain_s
            # past the deadline the followers end at their next wake-up (within a second)
            while service.open_streams and time.monotonic() < self._streams_deadline + 2:
                await asyncio.sleep(0.05)
        else:
            log.warning("draining: ending %d response(s) incomplete (no other replica)", len(runs))
            await service.stop_runs(runs, SHUTDOWN_REASON)

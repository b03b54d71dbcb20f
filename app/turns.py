"""Turns: a new response's set-up takes its turn with the streams already running.

When 256 paced streams end together, 256 requests arrive together, and each costs about a
millisecond of Python before its engine starts (validation, the prompt's rendering, the
response's first events). Handled as they come, they all run in one turn of the event loop: a
quarter of a second in which no commit's answer is read, no engine step is taken and no token
is sent, so every running stream's tokens wait (the 64-stream benchmark's slowest 1% of deltas
were a stream's first and last few, 20-70 ms late). Through a ``TurnGate``, one set-up runs a
turn of the loop; what the turn's I/O brought in (commits, client reads, the engine's step)
runs between two of them. The set-ups take as long in all; a burst's last one starts about as
late as before; the streams already running no longer wait for all of them.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["TurnGate"]


class TurnGate:
    """One caller of ``turn`` a turn of the event loop: the first in a turn goes at once, the
    others wait, in order, for a turn each."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._taken = False  # this turn's caller has gone
        self._loop: asyncio.AbstractEventLoop | None = None

    async def turn(self) -> None:
        """Return in a turn of the event loop no other caller has had."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (a new loop: a closed one's turns were never given)
            self._loop, self._taken, self._waiting = loop, False, deque()
        if not self._taken and not self._waiting:
            self._taken = True
            loop.call_soon(self._next)
            return
        waiter = loop.create_future()
        self._waiting.append(waiter)
        await waiter  # (cancelled: the turn given to it passes on with the next one)

    def _next(self) -> None:
        """The next turn's caller, if one waits: its task runs in the next turn, and so does
        this, after it (a turn's I/O callbacks come after both)."""
        waiting = self._waiting
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                asyncio.get_running_loop().call_soon(self._next)
                return
        self._taken = False

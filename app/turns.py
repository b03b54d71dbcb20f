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

One a turn still let a burst's set-ups take nearly all of the loop while it lasted: the loop
was busy 85-100 % for the 0.7 s of such a wave, and every delta over the 256-stream p99 was in
one (bench/RESULTS.md, twenty-third session). So while responses whose engine paces them are
being generated (``app.feed.Paced``: vLLM's, the scripted engine's with a token delay), the
set-ups of a burst take at most ``share`` of the loop's time: after a set-up's turn the next
one waits (at the default share, two thirds) half as long as that turn took, and the streams'
steps, commits and sends run in that time. New responses wait a little for running ones, as an
engine's scheduler puts the running requests' next tokens before new prompts. Measured at 256
paced streams against one a turn, two pairs each (bench/RESULTS.md, twenty-fifth session): at
two thirds, the added latency's p99 16.2, 17.7 -> 13.2, 16.0 ms on PostgreSQL and 34.2, 26.3
-> 24.8, 20.8 on SQLite, a burst's last first token a little later (TTFT p99 197-232 ->
217-278 ms), tokens/s the same (0.01 of the peer's lower when the VM ran slower: each stream's
cycle is a little longer); at one half, p99 a little lower again but TTFT p99 251-324 ms
and SQLite's tokens/s 1 % lower. With an engine that hands its tokens over as fast as they are
read (the unpaced benchmark) there is no step for the streams to keep and the pause only
delayed the new responses (unpaced, SQLite's tokens/s 1-7 % lower in five cells of six): it
pauses for paced generations only. A set-up that comes alone waits at most for the pause the one before it
earned; with no paced response generating, a burst goes one a turn without pause.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

__all__ = ["SETUP_SHARE", "TurnGate"]

#: The most of the event loop's time a burst of set-ups takes while paced responses generate
#: (``TurnGate``'s ``share``; the setting ``RESPONSES_LEDGER_SETUP_SHARE``).
SETUP_SHARE = 2 / 3


def _never() -> bool:
    return False


class TurnGate:
    """One caller of ``turn`` a turn of the event loop: the first in a turn goes at once, the
    others wait, in order, for a turn each. While ``busy()`` (paced responses generate), the
    next caller's turn comes no sooner than the last one's took, times ``(1 - share) / share``,
    after it: the callers take at most ``share`` of the loop's time (1: no pause)."""

    def __init__(self, busy: Callable[[], bool] = _never, share: float = SETUP_SHARE) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        #: Whether paced responses are generating now (``app.feed.Paced``).
        self.busy = busy
        #: The most of the loop's time the callers take while ``busy()``.
        self.share = share
        self._rest = (1 - share) / share  # the pause after a turn, per second the turn took
        #: Pauses taken since the gate was made (one a set-up while ``busy()``, share < 1).
        self.pauses = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._taken = False  # this turn's caller has gone
        self._given_at: float | None = None  # when the last turn was given (perf_counter)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def turn(self) -> None:
        """Return in a turn of the event loop no other caller has had."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (a new loop: a closed one's turns were never given)
            self._loop, self._taken, self._waiting = loop, False, deque()
        if not self._taken and not self._waiting:
            self._taken = True
            self._given_at = time.perf_counter()
            loop.call_soon(self._next)
            return
        waiter = loop.create_future()
        self._waiting.append(waiter)
        await waiter  # (cancelled: the turn given to it passes on with the next one)

    def _next(self) -> None:
        """Called in the turn given, right after its caller's task ran (it was scheduled
        first): the pause the turn earned while ``busy()``, then the next turn's caller, if
        one waits: its task runs in the next turn, and so does this, after it (a turn's I/O
        callbacks come after both). The loop's own clock is not used to time the turn: uvloop's
        counts whole milliseconds."""
        loop = asyncio.get_running_loop()
        # (after the pause this runs again, with no turn given since: the next one goes now)
        given, self._given_at = self._given_at, None
        if given is not None and self._rest and self.busy():
            pause = (time.perf_counter() - given) * self._rest
            if pause > 0:
                self.pauses += 1
                loop.call_later(pause, self._next)
                return
        waiting = self._waiting
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._given_at = time.perf_counter()
                loop.call_soon(self._next)
                return
        self._taken = False

"""A burst of new responses takes one turn of the event loop each (``app.turns``)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from app.settings import Settings
from app.turns import SETUP_SHARE, TurnGate


async def test_a_burst_goes_through_one_a_turn_and_the_loops_other_callbacks_run_between() -> None:
    loop = asyncio.get_running_loop()
    gate = TurnGate()
    turn = 0
    ticking = True

    def tick() -> None:  # a callback a turn of the loop, as a commit's answer or a step would be
        nonlocal turn
        turn += 1
        if ticking:
            loop.call_soon(tick)

    loop.call_soon(tick)
    went: list[tuple[str, int]] = []

    async def caller(name: str) -> None:
        await gate.turn()
        went.append((name, turn))

    names = [f"r{i}" for i in range(8)]
    await asyncio.gather(*(caller(name) for name in names))
    assert [name for name, _ in went] == names  # in the order they came
    turns = [at for _, at in went]
    assert all(b > a for a, b in itertools.pairwise(turns)), turns  # one a turn

    # a waiter cancelled before its turn gives it to the next one; an idle gate lets one through at once
    went.clear()
    first = asyncio.ensure_future(caller("a"))
    doomed = asyncio.ensure_future(caller("b"))
    last = asyncio.ensure_future(caller("c"))
    await asyncio.sleep(0)
    doomed.cancel()
    await asyncio.gather(first, last)
    assert [name for name, _ in went] == ["a", "c"]
    await asyncio.sleep(0.01)
    before = turn
    await gate.turn()
    ticking = False
    assert turn == before  # no wait: nobody else had this turn


def test_a_gate_used_again_on_a_new_event_loop_lets_its_first_caller_through() -> None:
    """A server's service outlives an event loop in tests (one per client session): a turn
    taken on a loop that closed before its next turn must not hold the gate shut."""
    gate = TurnGate()
    first = asyncio.new_event_loop()

    async def take_and_stop() -> None:
        await gate.turn()
        asyncio.get_running_loop().stop()  # it stops before the turn that would reopen the gate

    task = first.create_task(take_and_stop())
    first.run_forever()
    assert task.done()
    first.close()
    asyncio.run(asyncio.wait_for(gate.turn(), 1.0))


async def _burst(gate: TurnGate, setup_s: float, callers: int = 4) -> tuple[list[float], list[int]]:
    """``callers`` set-ups through ``gate`` at once, each holding the loop ``setup_s`` after its
    turn (a set-up's Python); returns the pause before each one after the first (from the end of
    the one before) and how many other callbacks the loop ran in it."""
    loop = asyncio.get_running_loop()
    ticks = 0
    ticking = True

    def tick() -> None:  # the loop's other work: a callback a turn, as the streams' would be
        nonlocal ticks
        ticks += 1
        if ticking:
            loop.call_soon(tick)

    loop.call_soon(tick)
    spans: list[tuple[float, float, int, int]] = []

    async def caller() -> None:
        await gate.turn()
        start, ticks_at_start = time.perf_counter(), ticks
        time.sleep(setup_s)
        spans.append((start, time.perf_counter(), ticks_at_start, ticks))

    await asyncio.gather(*(caller() for _ in range(callers)))
    ticking = False
    pauses = [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    ran = [b[2] - a[3] for a, b in itertools.pairwise(spans)]
    return pauses, ran


async def test_while_responses_generate_a_burst_takes_at_most_its_share_of_the_loop() -> None:
    """At a share of one half, each set-up after the first waits as long as the one before it
    took, and the loop's other callbacks run in that time; at a quarter, three times as long;
    at the default (two thirds), half as long."""
    setup_s = 0.004
    gate = TurnGate(lambda: True, share=0.5)
    pauses, ran = await _burst(gate, setup_s)
    assert all(p >= 0.8 * setup_s for p in pauses), pauses
    assert gate.pauses == 4  # one after each set-up's turn
    assert all(n > 10 for n in ran), ran  # the streams' turns, not only the next set-up's
    pauses, _ = await _burst(TurnGate(lambda: True, share=0.25), setup_s)
    assert all(p >= 0.8 * 3 * setup_s for p in pauses), pauses
    pauses, _ = await _burst(TurnGate(lambda: True), setup_s)
    assert all(p >= 0.8 * 0.5 * setup_s for p in pauses), pauses


async def test_with_nothing_generating_or_a_share_of_one_a_burst_goes_one_a_turn() -> None:
    for gate in (TurnGate(lambda: False), TurnGate(lambda: True, share=1.0), TurnGate()):
        _, ran = await _burst(gate, 0.004)
        assert all(n <= 2 for n in ran), ran  # the next set-up in the next turn or so
        assert gate.pauses == 0


def test_a_share_outside_zero_to_one_is_refused() -> None:
    for share in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="share"):
            TurnGate(share=share)
    assert TurnGate(share=1.0).share == 1.0


def test_the_setup_share_setting() -> None:
    assert Settings.from_env({}).setup_share == SETUP_SHARE == 2 / 3
    assert Settings.from_env({"RESPONSES_LEDGER_SETUP_SHARE": "0.25"}).setup_share == 0.25
    for bad in ("0", "1.5", "-1", "half"):
        with pytest.raises(ValueError):
            Settings.from_env({"RESPONSES_LEDGER_SETUP_SHARE": bad})

"""A burst of new responses takes one turn of the event loop each (``app.turns``)."""

from __future__ import annotations

import asyncio
import itertools

from app.turns import TurnGate


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

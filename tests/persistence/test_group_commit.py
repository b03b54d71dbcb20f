"""GroupCommit on its own, with a fake flush that records the batches it gets."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from persistence.errors import StoreError
from persistence.group_commit import GroupCommit


@dataclass(eq=False)
class Item:
    name: str
    future: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class FakeFlush:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.fail_next = False

    async def __call__(self, batch: list[Item]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.batches.append([item.name for item in batch])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("disk on fire")
        for item in batch:
            item.future.set_result(None)


async def test_items_within_a_window_share_one_flush() -> None:
    flush = FakeFlush()
    commits: GroupCommit[Item] = GroupCommit(flush, window_s=0.05, max_batch=1000)
    items = [Item(str(i)) for i in range(10)]
    for item in items:
        commits.put(item)
        await asyncio.sleep(0.001)
    await asyncio.gather(*(i.future for i in items))
    assert flush.batches == [[str(i) for i in range(10)]]
    await commits.close()


async def test_a_full_batch_does_not_wait_for_the_window() -> None:
    flush = FakeFlush()
    commits: GroupCommit[Item] = GroupCommit(flush, window_s=30.0, max_batch=8)
    items = [Item(str(i)) for i in range(4)]
    for item in items:
        commits.put(item, weight=2)
    async with asyncio.timeout(2):
        await asyncio.gather(*(i.future for i in items))
    assert flush.batches == [["0", "1", "2", "3"]]
    await commits.close()


async def _flushing_first(window_s: float) -> tuple[FakeFlush, GroupCommit[Item], Item]:
    """A group commit whose first flush (of item "first") is under way, held at the gate."""
    flush = FakeFlush()
    flush.gate = asyncio.Event()
    commits: GroupCommit[Item] = GroupCommit(flush, window_s=window_s, max_batch=1000)
    first = Item("first")
    commits.put(first)
    commits._first_at -= window_s  # its window is over
    await asyncio.sleep(0.01)  # the flush of "first" is now blocked on the gate
    return flush, commits, first


async def test_items_queued_during_a_flush_form_the_next_batch() -> None:
    flush, commits, first = await _flushing_first(0.0)
    later = [Item(f"later{i}") for i in range(5)]
    for item in later:
        commits.put(item)
    flush.gate.set()
    await asyncio.gather(first.future, *(i.future for i in later))
    assert flush.batches == [["first"], [f"later{i}" for i in range(5)]]
    await commits.close()


async def test_close_flushes_at_once_and_then_refuses() -> None:
    flush = FakeFlush()
    commits: GroupCommit[Item] = GroupCommit(flush, window_s=30.0, max_batch=1000)
    item = Item("pending")
    commits.put(item)
    async with asyncio.timeout(2):
        await commits.close()
    assert item.future.done() and flush.batches == [["pending"]]
    with pytest.raises(StoreError):
        commits.put(Item("late"))


async def test_a_failing_flush_fails_its_items_and_the_next_batch_still_runs() -> None:
    flush = FakeFlush()
    flush.fail_next = True
    commits: GroupCommit[Item] = GroupCommit(flush, window_s=0.0, max_batch=1000)
    doomed = Item("doomed")
    commits.put(doomed)
    with pytest.raises(StoreError) as caught:
        await doomed.future
    assert isinstance(caught.value.__cause__, RuntimeError)
    survivor = Item("survivor")
    commits.put(survivor)
    await survivor.future
    assert flush.batches == [["doomed"], ["survivor"]]
    await commits.close()


async def test_cancelling_the_task_fails_waiters_instead_of_hanging() -> None:
    flush = FakeFlush()
    flush.gate = asyncio.Event()  # never set: the flush hangs
    commits: GroupCommit[Item] = GroupCommit(flush, window_s=0.0, max_batch=1000)
    stuck = Item("stuck")
    commits.put(stuck)
    await asyncio.sleep(0.01)
    queued = Item("queued")
    commits.put(queued)
    task = commits._task
    assert task is not None
    task.cancel()
    for item in (stuck, queued):
        with pytest.raises(StoreError):
            await item.future
    with pytest.raises(StoreError):
        commits.put(Item("after"))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        GroupCommit(FakeFlush(), window_s=-1, max_batch=10)
    with pytest.raises(ValueError):
        GroupCommit(FakeFlush(), window_s=0, max_batch=0)


async def test_writes_made_during_a_flush_go_right_after_it_not_a_window_later() -> None:
    flush, commits, first = await _flushing_first(30.0)
    during = Item("during")
    commits.put(during)  # while the first flush runs
    after = Item("after")
    first.future.add_done_callback(lambda _: commits.put(after))  # a writer the flush released
    flush.gate.set()
    # a 30 s window would time this out: the second batch goes as soon as the first is done,
    # and it includes what the released writer queued in reply
    await asyncio.wait_for(asyncio.gather(during.future, after.future), timeout=5)
    assert flush.batches == [["first"], ["during", "after"]]
    await commits.close()

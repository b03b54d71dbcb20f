"""``app.tails``: followers woken together read together (one store query), each gets the
events after its own seq, and a store failure reaches every reader of the batch."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from app.tails import TailReads
from persistence.errors import StoreUnavailable
from persistence.memory import MemoryStore
from persistence.records import StoredEvent
from tests.persistence.factories import created, delta, new_response


class _Counting(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[dict[str, int]] = []
        self.fail = False

    async def load_after(self, afters: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        self.batches.append(dict(afters))
        if self.fail:
            raise StoreUnavailable("down")
        return await super().load_after(afters)


async def _log(store: MemoryStore, deltas: int) -> str:
    new = new_response()
    await store.create_response(new)
    await store.append(new.id, [created(new.id), *(delta(i) for i in range(1, deltas + 1))], 0)
    return new.id


async def test_reads_asked_together_are_one_query() -> None:
    store = _Counting()
    ids = [await _log(store, 3) for _ in range(20)]
    reads = TailReads(store)
    assert [e.seq for e in await reads.read(ids[0], 1)] == [2, 3]
    store.batches.clear()
    results = await asyncio.gather(*(reads.read(rid, i % 4 - 1) for i, rid in enumerate(ids)))
    assert len(store.batches) == 1 and len(store.batches[0]) == 20
    for i, events in enumerate(results):
        assert [e.seq for e in events] == list(range(i % 4, 4))
    # two followers of one log, at different seqs, in one batch
    both = await asyncio.gather(reads.read(ids[0], 0), reads.read(ids[0], 2))
    assert [[e.seq for e in events] for events in both] == [[1, 2, 3], [3]]
    assert (reads.reads, reads.queries) == (23, 3)


async def test_a_failed_read_fails_every_reader_of_its_batch_and_the_next_batch_reads_again() -> (
    None
):
    store = _Counting()
    ids = [await _log(store, 1) for _ in range(3)]
    reads = TailReads(store)
    store.fail = True
    outcomes = await asyncio.gather(*(reads.read(rid, 0) for rid in ids), return_exceptions=True)
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    store.fail = False
    assert [e.seq for e in await reads.read(ids[0], 0)] == [1]
    assert len(store.batches) == 2

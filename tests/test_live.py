"""The live pipeline of one response (app.live): persist, then publish, and what may follow the
terminal events into their commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from app.live import Backlog, LogWriter, Run, Subscription, stored_event
from domain.builder import ResponseBuilder
from domain.events import OutputTextDelta
from persistence.errors import StoreError
from persistence.records import StoredEvent
from persistence.store import Done
from tests.domain.factories import counter_ids, response_skeleton


class _Store:
    """Records every submission in order; the test settles each one by hand (``settle``)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.pending: list[Done | asyncio.Future[None]] = []

    def submit_then(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        done: Done,
        token_ids: Sequence[int] = (),
    ) -> None:
        self.calls.append(f"events {events[0].seq}-{events[-1].seq}")
        self.pending.append(done)

    def audit(self) -> asyncio.Future[None]:
        self.calls.append("audit")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def settle(self, index: int, error: BaseException | None = None) -> None:
        pending = self.pending[index]
        if isinstance(pending, asyncio.Future):
            if error is None:
                pending.set_result(None)
            else:
                pending.set_exception(error)
        else:
            asyncio.get_running_loop().call_soon(pending, error)  # later, as a store does


def _delta(seq: int) -> OutputTextDelta:
    return OutputTextDelta(seq, "msg_1", 0, 0, f"t{seq}")


def _writer(store: _Store) -> tuple[LogWriter, Run]:
    run = Run(id="resp_1", store=True, background=False, engine_request_id="resp_1")
    return LogWriter(run, store.submit_then), run


async def test_what_is_submitted_after_goes_right_behind_the_events_pushed_before_it() -> None:
    store = _Store()
    writer, _ = _writer(store)
    writer.push([_delta(0)])  # goes at once: nothing in flight
    writer.push([_delta(1), _delta(2)])  # waits for the commit in flight
    audit = writer.submit_after(store.audit)
    assert store.calls == ["events 0-0"]  # not before the events it follows
    store.settle(0)
    await asyncio.sleep(0)
    assert store.calls == ["events 0-0", "events 1-2", "audit"]  # in the same turn: one commit
    store.settle(1)
    store.settle(2)
    await audit
    await writer.drain()


async def test_with_nothing_waiting_it_is_submitted_at_once() -> None:
    store = _Store()
    writer, _ = _writer(store)
    writer.push([_delta(0)])
    audit = writer.submit_after(store.audit)
    assert store.calls == ["events 0-0", "audit"]
    store.settle(1, StoreError("disk full"))
    with pytest.raises(StoreError, match="disk full"):
        await audit


async def test_if_the_events_cannot_be_written_it_is_never_submitted() -> None:
    store = _Store()
    writer, run = _writer(store)
    writer.push([_delta(0)])
    writer.push([_delta(1)])
    audit = writer.submit_after(store.audit)
    store.settle(0, StoreError("disk full"))
    with pytest.raises(StoreError, match="disk full"):
        await audit
    assert store.calls == ["events 0-0"]
    assert isinstance(run.error, StoreError)
    later = writer.submit_after(store.audit)  # after the failure: refused at once
    with pytest.raises(StoreError):
        await later
    assert store.calls == ["events 0-0"]


async def test_a_commit_pulls_what_waited_for_it_as_one_delta_with_every_token() -> None:
    """While a commit is in flight the generation task leaves its events in a coalescing
    builder; the commit's return takes them (``pull``): one delta for the text of every token
    that waited, handed over with all those tokens, and the backlog counts the tokens."""
    store = _Store()
    tokens: list[Sequence[int]] = []

    def submit(
        rid: str, events: Sequence[StoredEvent], seq: int, done: Done, token_ids: Sequence[int] = ()
    ) -> None:
        tokens.append(list(token_ids))
        store.submit_then(rid, events, seq, done, token_ids)

    run = Run(id="resp_1", store=True, background=False, engine_request_id="resp_1")
    writer = LogWriter(run, submit)
    builder = ResponseBuilder(response_skeleton(), new_id=counter_ids(), coalesce=True)
    builder.created()
    builder.open_message()
    writer.pull = builder.take
    writer.push(builder.take(), [1, 2])  # created, item and part added: at once
    assert writer.inflight and store.calls == ["events 0-2"]
    for token, word in enumerate([" a", " b", " c"], start=3):
        builder.append(word)
        writer.push((), [token])  # in flight: the text stays in the builder
    assert writer.backlog == 3 and writer.queued == 0 and store.calls == ["events 0-2"]
    store.settle(0)
    await asyncio.sleep(0)
    assert store.calls == ["events 0-2", "events 3-3"]  # one delta
    assert tokens == [[1, 2], [3, 4, 5]]
    assert writer.backlog == 0
    published = run.subscribe()
    store.settle(1)
    await asyncio.sleep(0)
    batch = await published.get()
    assert b'"sequence_number":3,' in batch.frames[0] and b'"delta":" a b c"' in batch.frames[0]
    assert not writer.inflight  # nothing more waited: the next token goes at once
    writer.pull = None
    builder.append(" d")
    writer.push(builder.take(), [6])
    assert store.calls[-1] == "events 4-4"


async def test_a_token_and_the_delta_it_made_count_once_in_the_shared_backlog() -> None:
    """Without a coalescing builder each token's delta is pushed with it: the shared backlog
    (what pauses a fast engine, ``app.feed``) counts the delta, not the token too, so its budget
    holds as many tokens as it says. With one, the token is counted (its text waits in the
    builder) and its delta, made at the hand-over, is not counted again."""
    store = _Store()
    backlog = Backlog()
    run = Run(id="resp_1", store=True, background=False, engine_request_id="resp_1")
    writer = LogWriter(run, store.submit_then, backlog)
    writer.push([_delta(0)], [100])  # handed over at once: nothing waits
    assert writer.inflight and backlog.total == 0
    for seq in range(1, 4):
        writer.push([_delta(seq)], [100 + seq])  # each waits for the commit in flight
    assert writer.backlog == 3 and backlog.total == 3
    store.settle(0)
    await asyncio.sleep(0)
    assert store.calls == ["events 0-0", "events 1-3"] and backlog.total == 0

    builder = ResponseBuilder(response_skeleton(), new_id=counter_ids(), coalesce=True)
    builder.created()
    builder.open_message()
    writer.pull = builder.take
    for token, word in enumerate([" a", " b"], start=200):
        builder.append(word)
        writer.push((), [token])  # in flight: the text stays in the builder, the token counts
    assert writer.backlog == 2 and backlog.total == 2
    store.settle(1)
    await asyncio.sleep(0)
    assert backlog.total == 0 and writer.backlog == 0
    writer.close()
    assert backlog.total == 0


async def test_drain_waits_until_nothing_is_in_flight_and_next_commit_for_the_next_commit() -> None:
    """``next_commit`` (an engine faster than the log) returns at the commit in flight;
    ``drain`` only once everything pushed before it is durable, however many commits that
    takes; a cancelled wait harms neither; a failed commit ends ``drain`` with its error."""
    store = _Store()
    writer, _ = _writer(store)
    await asyncio.wait_for(writer.drain(), 1)  # nothing in flight: at once
    assert writer.next_commit() is None
    writer.push([_delta(0)])
    writer.push([_delta(1)])  # waits behind the commit in flight
    drained = asyncio.ensure_future(writer.drain())
    committed = writer.next_commit()
    assert committed is not None
    gave_up = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    gave_up.cancel()
    store.settle(0)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert committed.done() and not drained.done()  # events 1-1 are in flight now
    assert store.calls == ["events 0-0", "events 1-1"]
    store.settle(1)
    await asyncio.wait_for(drained, 1)
    assert gave_up.cancelled()
    writer.push([_delta(2)])
    failed = asyncio.ensure_future(writer.drain())
    store.settle(2, StoreError("disk full"))
    with pytest.raises(StoreError, match="disk full"):
        await asyncio.wait_for(failed, 1)


async def test_a_subscription_hands_over_batches_in_order_and_survives_a_cancelled_wait() -> None:
    store = _Store()
    writer, run = _writer(store)
    queue: Subscription = run.subscribe()
    waiting = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    waiting.cancel()  # a reader that gave up: nothing is lost for the next get
    with pytest.raises(asyncio.CancelledError):
        await waiting
    writer.push([_delta(0)])
    store.settle(0)
    writer.push([_delta(1)])
    await asyncio.sleep(0)
    store.settle(1)
    await asyncio.sleep(0)
    first, second = await queue.get(), await queue.get()
    assert (first.first_seq, second.first_seq) == (0, 1)
    assert queue.empty()


def test_a_stored_event_carries_the_payload_its_text_says() -> None:
    """The record of every kind of event: its text is the wire payload, and where the object
    comes along (so the store need not parse a lifecycle event back) it is that same payload."""
    from domain.builder import Usage
    from domain.projections import payload
    from tests.domain.factories import make_builder

    b = make_builder()
    b.created()
    b.in_progress()
    b.open_reasoning()
    b.append("think")
    b.open_message()
    b.append("Hel")
    b.open_function_call("get_weather")
    b.append('{"city":"Paris"}')
    b.finish("completed", usage=Usage(10, 0, 5, 1), completed_at=1)
    for event in b.take():
        record = stored_event(event)
        assert record.payload_json is not None
        assert json.loads(record.payload_json) == json.loads(json.dumps(payload(event))), event.type
        assert record.payload == json.loads(record.payload_json), event.type


async def test_a_bounded_subscription_drops_what_it_holds_past_its_limit() -> None:
    """A reader whose client stopped reading cannot make its queue grow past the limit: the
    queue empties and the reader is told, so it can catch up from the log instead."""
    from app.live import Batch, SubscriptionOverflow

    queue = Subscription(limit_bytes=100)
    queue.put_nowait(Batch(0, (b"x" * 60,), False))
    assert (await queue.get()).first_seq == 0  # read in time: its bytes no longer count
    queue.put_nowait(Batch(1, (b"x" * 60,), False))
    assert not queue.overflowed
    queue.put_nowait(Batch(2, (b"x" * 60,), False))  # 120 queued > 100
    assert queue.overflowed and not queue.empty()
    queue.put_nowait(Batch(3, (b"x",), False))  # ignored once overflowed
    with pytest.raises(SubscriptionOverflow):
        await queue.get()
    unbounded = Subscription()
    for seq in range(5):
        unbounded.put_nowait(Batch(seq, (b"x" * 60,), False))
    assert [(await unbounded.get()).first_seq for _ in range(5)] == [0, 1, 2, 3, 4]


async def test_an_attached_subscription_writes_each_batch_as_it_is_published() -> None:
    """A live stream's batches go to its writer in the publisher's call, in order, queued ones
    first; the terminal batch detaches it and is queued for the reader, which ends the stream."""
    from app.live import Batch

    queue = Subscription()
    queue.put_nowait(Batch(0, (b"a",), False))  # published before the reader attached
    queue.put_nowait(Batch(1, (b"b", b"c"), False))
    written: list[bytes] = []

    def write(body: bytes) -> bool:
        written.append(body)
        return True

    detached = queue.attach(write)
    assert written == [b"a", b"bc"] and queue.empty() and not detached.done()
    queue.put_nowait(Batch(3, (b"d",), False))
    assert written == [b"a", b"bc", b"d"] and queue.written == 3  # no reader woke for it
    queue.put_nowait(Batch(4, (b"end",), True))
    assert written == [b"a", b"bc", b"d"] and detached.done()
    assert (await queue.get()).frames == (b"end",)  # the reader sends the end itself
    queue.put_nowait(Batch(5, (b"late",), False))  # detached: queued, not written
    assert written[-1] == b"d" and not queue.empty()


async def test_a_batch_the_writer_refuses_detaches_and_waits_for_the_reader() -> None:
    """A writer that cannot write (the connection is gone, or was cut past its send buffer),
    or that fails, loses nothing: that batch and the later ones are queued for the reader."""
    from app.live import Batch

    for refusal in ("refuse", "raise"):
        queue = Subscription()
        calls: list[bytes] = []

        def write(body: bytes, refusal: str = refusal, calls: list[bytes] = calls) -> bool:
            calls.append(body)
            if body == b"b":
                if refusal == "raise":
                    raise OSError("the transport broke")
                return False
            return True

        detached = queue.attach(write)
        queue.put_nowait(Batch(0, (b"a",), False))
        queue.put_nowait(Batch(1, (b"b",), False))
        assert detached.done() and queue.written == 0
        queue.put_nowait(Batch(2, (b"c",), False))
        assert calls == [b"a", b"b"]
        assert [(await queue.get()).first_seq for _ in range(2)] == [1, 2]

    queue = Subscription()
    queue.put_nowait(Batch(0, (b"a",), False))
    queue.put_nowait(Batch(1, (), True))  # the run stopped without a terminal event
    written: list[bytes] = []
    # what comes before the end is written; then nothing is left to attach for
    assert queue.attach(lambda body: written.append(body) is None).done()
    assert written == [b"a"] and queue.written == 0
    assert (await queue.get()).first_seq == 1

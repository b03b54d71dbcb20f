"""Live responses in this process: their writers and their stream subscribers.

A :class:`Run` is the in-process side of one response being generated. Its :class:`LogWriter`
turns events into stored events and SSE frames, hands them to the store for group commit, and
publishes each committed batch to the subscribers *after* it is durable (persist, then publish).
While a batch is being committed the next events accumulate, so every commit carries all the
events produced during the previous one, and every subscriber gets one write per commit. The
creating request's subscription is *attached* to its connection once its stream has begun
(:meth:`Subscription.attach`): publishing a batch then writes it to the socket in the commit's own
callback, so a token wakes no reader task and crosses no ``send`` chain.

``store=false`` responses have no store: their batches are published at once and never written.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.metrics import StreamTiming
from domain.events import TERMINAL_TYPES, Event
from domain.projections import payload_and_json, sse_frame
from persistence.records import StoredEvent
from persistence.store import Done, then

__all__ = [
    "Backlog",
    "Batch",
    "LogWriter",
    "Run",
    "Subscription",
    "SubscriptionOverflow",
    "error_frame",
    "stored_event",
    "stored_frames",
]

log = logging.getLogger(__name__)

#: The events a response opens with, before any output (not timed as output, ``app.metrics``).
_OPENING = frozenset({"response.created", "response.queued", "response.in_progress"})


class Batch:
    """Consecutive events made durable together: ``frames[i]`` is the SSE frame of seq
    ``first_seq + i``. (A plain slots class: one is made per commit per response, per token
    when an engine paces its tokens, and a frozen dataclass's ``__init__`` costs twice as much.)"""

    __slots__ = ("first_seq", "frames", "nbytes", "terminal")

    def __init__(self, first_seq: int, frames: Sequence[bytes], terminal: bool) -> None:
        self.first_seq = first_seq
        self.frames = frames
        self.terminal = terminal
        self.nbytes = -1  # counted only if a bounded subscription asks (see ``size``)

    def size(self) -> int:
        """The bytes of its frames (counted once, on demand: most batches only pass through
        unbounded queues)."""
        if self.nbytes < 0:
            self.nbytes = sum(map(len, self.frames))
        return self.nbytes

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.frames) - 1


class SubscriptionOverflow(Exception):
    """A bounded subscription's reader fell more than its limit behind; what it held is gone
    (a store=true reader re-reads it from the log)."""


class Subscription:
    """One reader's queue of published batches: what ``asyncio.Queue`` does here (put without
    waiting, get or wait, empty), without its size bookkeeping or a future per ``get``.

    With ``limit_bytes``, a reader that falls behind (its client stopped reading, so its sends
    wait) cannot make the queue grow past that: once it would, the queue drops what it holds,
    and ``get`` raises ``SubscriptionOverflow``."""

    __slots__ = (
        "_batches",
        "_bytes",
        "_detached",
        "_limit",
        "_waiter",
        "_write",
        "overflowed",
        "written",
    )

    def __init__(self, limit_bytes: int | None = None) -> None:
        self._batches: collections.deque[Batch] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._limit = limit_bytes
        self._bytes = 0
        self.overflowed = False
        #: While attached (:meth:`attach`): where batches are written as they are published.
        self._write: Callable[[bytes], bool] | None = None
        self._detached: asyncio.Future[None] | None = None
        #: The last seq written while attached (-1: none).
        self.written = -1

    def attach(self, write: Callable[[bytes], bool]) -> asyncio.Future[None]:
        """Hand every batch published from now on (and any queued) to ``write`` at once, in
        the publisher's call, instead of queueing it for a reader's task to wake up and send:
        a live stream's frames then reach its socket straight from the commit that made them
        durable, with no task switch per token. ``write`` returns False when it cannot write.

        The terminal batch is never written here, nor is a batch ``write`` refuses: either
        detaches the subscription, queues that batch, and resolves the future returned, so the
        reader goes on with ``get`` (and ends the stream as it always does). Unbounded
        subscriptions only (a bounded one's reader must be able to fall behind)."""
        assert self._limit is None and self._write is None
        detached: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write, self._detached = write, detached
        queued, self._batches = self._batches, collections.deque()
        for batch in queued:  # as if published now: written, or (from the first that is not) queued
            self.put_nowait(batch)
        return detached

    def _detach(self) -> None:
        detached = self._detached
        self._write = self._detached = None
        if detached is not None and not detached.done():
            detached.set_result(None)

    def put_nowait(self, batch: Batch) -> None:
        write = self._write
        if write is not None:
            if not batch.terminal and batch.frames:
                # written here, not in a method of its own: once a paced token
                try:
                    # (one frame: joined, it is that same object)
                    written = write(b"".join(batch.frames))
                except Exception:  # a transport that fails must not fail the commit that published
                    log.exception("writing a live stream's batch failed")
                    written = False
                if written:
                    self.written = (
                        batch.first_seq + len(batch.frames) - 1
                    )  # (``last_seq``, inlined)
                    return
            self._detach()
        if self._limit is not None:
            if self.overflowed:
                return
            self._bytes += batch.size()
            if self._bytes > self._limit:
                self._batches.clear()
                self._bytes = 0
                self.overflowed = True
            else:
                self._batches.append(batch)
        else:
            self._batches.append(batch)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._batches and not self.overflowed

    async def get(self) -> Batch:
        while not self._batches:
            if self.overflowed:
                raise SubscriptionOverflow
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        batch = self._batches.popleft()
        if self._limit is not None:
            self._bytes -= batch.size()
        return batch


@dataclass(eq=False)
class Run:
    id: str
    store: bool
    background: bool
    engine_request_id: str
    #: The served model (what the metrics count it under).
    model: str = ""
    #: When its request arrived (``time.monotonic``): time to first token counts from it.
    #: None for a takeover (its request arrived elsewhere).
    started: float | None = None
    subscribers: set[Subscription] = field(default_factory=set)
    #: Set once the terminal event is durable (and published).
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once response.created (and queued) are durable and published, or the run failed
    #: before that (``error`` says why).
    created: asyncio.Event = field(default_factory=asyncio.Event)
    #: The Response as its first events carried it (what the POST of a background response answers).
    created_response: dict[str, Any] | None = None
    final_response: dict[str, Any] | None = None
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None
    #: The creating request's subscription, taken before generation starts (stream=true).
    first_queue: Subscription | None = None
    #: Why the run could not write its log (the store failed); None while all is well.
    error: BaseException | None = None
    #: Some of its events were durable and published.
    published: bool = False
    #: It stopped here without ending its log because another replica goes on with it (a
    #: takeover fenced this one out, or a drain handed it over): streams follow the log.
    handed_off: bool = False
    #: Why it is being stopped short (a drain with no replica to hand it to): it ends
    #: ``incomplete`` with this reason.
    stop_reason: str | None = None

    def subscribe(self, limit_bytes: int | None = None) -> Subscription:
        queue = Subscription(limit_bytes)
        self.subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: Subscription) -> None:
        self.subscribers.discard(queue)

    def publish(self, batch: Batch) -> None:
        for queue in self.subscribers:
            queue.put_nowait(batch)
        if not self.published and batch.frames:  # the first batch holds response.created
            self.published = True
            self.created.set()


def stored_event(event: Event) -> StoredEvent:
    """The store's record of an event: its JSON text, made once (the SSE frame reuses it), and
    the payload object where making the text built it anyway (a delta's is parsed from the text
    only if someone asks)."""
    obj, text = payload_and_json(event)
    return StoredEvent(event.sequence_number, event.type, obj, text)


def stored_frames(events: Sequence[StoredEvent]) -> bytes:
    """The SSE bytes of stored events: what was streamed live, re-made from the log."""
    return b"".join(sse_frame(e.type, e.seq, e.payload_text()) for e in events)


def error_frame(seq: int, code: str, message: str) -> bytes:
    """The SSE ``error`` event that ends a stream when no terminal event can come (OpenAI's
    ``ResponseErrorEvent``). It is not in the log: ``seq`` is the one the next event would have
    taken (the terminal event the repair loop writes later takes it)."""
    data = {"code": code, "message": message, "param": None}
    return sse_frame("error", seq, json.dumps(data, separators=(",", ":")))


class Backlog:
    """How many events all live responses have pushed and not yet handed to the store, and
    for a response whose builder coalesces (``LogWriter.pull``), the output tokens whose text
    waits in it: about one a token either way (counting both a token and its delta halved the
    budget, ``app.feed``).

    Shared by every :class:`LogWriter` of a service, so generation can be paused when the
    server as a whole falls behind its commits, without throttling a lone fast stream."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class LogWriter:
    """Persist-then-publish pipeline for one response (one writer per response)."""

    def __init__(
        self,
        run: Run,
        submit: Callable[[str, Sequence[StoredEvent], int, Done, Sequence[int]], None] | None,
        backlog: Backlog | None = None,
        *,
        next_seq: int = 0,
        timing: StreamTiming | None = None,
    ) -> None:
        """``next_seq``: the log's length when this writer takes over (a takeover goes on with
        an existing log). ``timing``: where to observe what the streams receive (``app.metrics``):
        once per published batch that holds output, never per token."""
        self._run = run
        self._submit_fn = submit
        self._shared = backlog if backlog is not None else Backlog()
        self._events: list[StoredEvent] = []
        self._frames: list[bytes] = []
        #: Output token ids fed since the last hand-over: they go with the next events.
        self._tokens: list[int] = []
        #: How many of them the shared backlog counts (those fed while ``pull`` was set).
        self._counted = 0
        self._next_seq = next_seq
        #: A submission is in flight: what is pushed now waits for its commit.
        self.inflight = False
        # Who waits for the submission in flight: ``drain`` until none is, ``next_commit``
        # for the next commit. A future only when someone waits (once a response, and under
        # backpressure): two asyncio.Events set and cleared with every commit were three
        # Python calls a paced token.
        self._drains: list[asyncio.Future[None]] = []
        self._commits: list[asyncio.Future[None]] = []
        #: ``submit_after`` calls waiting for the events pushed before them to be handed over.
        self._after: list[tuple[Callable[[], asyncio.Future[None]], asyncio.Future[None]]] = []
        self.error: BaseException | None = None
        self._timing = timing
        #: Events pushed since the last hand-over are output (anything after the opening ones).
        self._output = False
        #: When the last batch with output was published (None: none yet).
        self._last_output: float | None = None
        #: The submission in flight: its batch, and whether it holds output.
        self._sent: Batch | None = None
        self._sent_output = False
        #: Where to take the events made since the last hand-over from, each time a commit can
        #: take them (the response's builder, while its tokens stream): the generation task then
        #: leaves them there while a commit is in flight, and a coalescing builder
        #: (``domain.builder``) makes one delta of all the text that waited, not one per token.
        self.pull: Callable[[], Sequence[Event]] | None = None

    @property
    def backlog(self) -> int:
        """Events pushed but not yet handed to the store (they wait for the commit in flight),
        and the tokens fed while ``pull`` was set, whose text may still wait in the builder: what
        this writer adds to the shared backlog."""
        return len(self._events) + self._counted

    @property
    def queued(self) -> int:
        """Events pushed and not yet handed to the store (the next submission begins with the
        first of them)."""
        return len(self._events)

    def submit_after(self, submit: Callable[[], asyncio.Future[None]]) -> asyncio.Future[None]:
        """Call ``submit`` (another write to the store) right after everything pushed so far
        is handed to the store, in the same turn, so it joins their commit unless that commit
        is already full; never before them (a crash cannot leave it without them). Returns a
        future for its outcome; if the events cannot be written, ``submit`` is never called
        and the future fails with their error."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.error is not None:
            future.set_exception(self.error)
        elif not self._events:
            _chain(submit(), future)
        else:
            self._after.append((submit, future))
        return future

    def next_commit(self) -> asyncio.Future[None] | None:
        """A future that resolves once the commit in flight is durable (backpressure for a fast
        engine); None when none is in flight."""
        return _waiter(self._commits) if self.inflight else None

    def push(self, events: Sequence[Event], token_ids: Sequence[int] = ()) -> None:
        """Queue events for the log; they are committed with the next group commit.
        ``token_ids``: the output tokens that produced them (a token that produced no event
        yet goes with the next events: the log never holds an event without its tokens)."""
        if token_ids and self._submit_fn is not None and self.error is None:
            self._tokens.extend(token_ids)
            if self.pull is not None:  # their text waits in the builder, not as events yet
                self._counted += len(token_ids)
                self._shared.total += len(token_ids)
        if not events:
            return
        if self.error is not None:
            raise self.error
        self._add(events)
        if not self.inflight:
            self._flush()

    def _add(self, events: Sequence[Event]) -> None:
        if events[0].type not in _OPENING:
            self._output = True
        stored, frames = self._events, self._frames
        for event in events:
            record = stored_event(event)
            stored.append(record)
            # (its text is set by stored_event; an assert or cast would cost a token a call)
            frames.append(sse_frame(record.type, record.seq, record.payload_json))  # type: ignore[arg-type]
        self._shared.total += len(events)

    def _flush(self) -> None:
        pull = self.pull
        if pull is not None:
            pulled = pull()
            if pulled:
                self._add(pulled)
        events, frames = self._events, self._frames
        if not events:
            self._idle()
            return
        self._events, self._frames = [], []
        self._shared.total -= len(events)
        batch = Batch(events[0].seq, frames, events[-1].type in TERMINAL_TYPES)
        output, self._output = self._output, False
        if self._submit_fn is None:
            self._next_seq += len(events)
            self._run.publish(batch)
            if output and self._timing is not None:
                self._observe(self._timing)
            self._flush()
            return
        self.inflight = True
        tokens, self._tokens = self._tokens, []
        self._shared.total -= self._counted
        self._counted = 0
        # the store calls back later, from its commit (never from inside this call); one
        # submission is in flight at a time, so what it carries waits here, not in a partial
        self._sent, self._sent_output = batch, output
        self._submit_fn(self._run.id, events, self._next_seq, self._durable, tokens)
        self._next_seq += len(events)
        if self._after:  # everything pushed before them is handed over now
            after, self._after = self._after, []
            for submit, outer in after:
                _chain(submit(), outer)

    def _observe(self, timing: StreamTiming) -> None:
        """A batch with output was just published to the streams (a response without a store:
        no commit to take the time from)."""
        now = time.monotonic()
        last = self._last_output
        if last is not None:
            timing.gap(now - last)
        elif self._run.started is not None:
            timing.first(now - self._run.started)
        self._last_output = now

    def _idle(self) -> None:
        """No submission in flight now: wake ``drain``."""
        self.inflight = False
        if self._drains:
            _wake(self._drains)

    def _durable(self, error: BaseException | None) -> None:
        batch, output = self._sent, self._sent_output
        self._sent = None
        if self._commits:
            _wake(self._commits)
        if error is not None:
            self.error = error
            log.error(
                "response %s: log write failed: %r",
                self._run.id,
                error,
                extra={"response_id": self._run.id},
            )
            self._run.error = self.error
            self._shared.total -= len(self._events) + self._counted  # never to be written
            self._events, self._frames, self._tokens = [], [], []
            self._counted = 0
            self.pull = None
            after, self._after = self._after, []
            for _, outer in after:
                outer.set_exception(self.error)
            self._idle()
            return
        assert batch is not None  # (a submission in flight has its batch)
        self._run.publish(batch)
        timing = self._timing
        if output and timing is not None:  # as _observe, inlined: once per commit per response
            # right after its commit: the time the store read when it was done
            now = timing.committed_at if timing.commit_clock else time.monotonic()
            last = self._last_output
            if last is not None:
                timing.gap(now - last)
            elif self._run.started is not None:
                timing.first(now - self._run.started)
            self._last_output = now
        self._flush()

    def close(self) -> None:
        """The run is over: what it pushed and never handed to the store (it stopped short)
        leaves the shared backlog."""
        self._shared.total -= len(self._events) + self._counted
        self._events, self._frames, self._tokens = [], [], []
        self._counted = 0
        self.pull = None

    async def drain(self) -> None:
        """Wait until everything pushed so far is durable and published."""
        if self.inflight:
            await _waiter(self._drains)
        if self.error is not None:
            raise self.error


def _waiter(waiters: list[asyncio.Future[None]]) -> asyncio.Future[None]:
    """A future added to ``waiters``, for ``_wake`` to resolve."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    return waiter


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    """Resolve and forget every future of ``waiters``."""
    woken = waiters[:]
    waiters.clear()
    for waiter in woken:
        if not waiter.done():  # (its waiter was cancelled)
            waiter.set_result(None)


def _chain(inner: asyncio.Future[None], outer: asyncio.Future[None]) -> None:
    """Resolve ``outer`` as ``inner`` resolves."""

    def settle(error: BaseException | None) -> None:
        if outer.done():
            return
        if error is None:
            outer.set_result(None)
        else:
            outer.set_exception(error)

    then(inner, settle)

"""The contract every event store keeps (``MemoryStore``, ``SqlStore``).

Writes:

- ``create_response`` is durable on return; appends for the response may follow at once.
  ``submit_create`` enqueues the same write and returns a future instead, so the first events
  can be submitted right behind it and share its commit (submissions commit in submission
  order; events submitted for a response whose create then fails fail too).
- ``submit_audit`` is to ``append_audit`` what ``submit`` is to ``append``.
- ``submit(response_id, events, expected_seq)`` enqueues events for group commit and returns a
  future that resolves once they are durable. ``expected_seq`` is the ``seq`` the first event
  must take, i.e. the length of the log once every earlier submission for the response has
  committed; the events carry ``expected_seq, expected_seq + 1, ...``. The future raises
  ``ConcurrencyError`` if that ``seq`` is taken or is not next, or if the log already ended,
  ``NotFound`` if there is no such response, ``RefusedWrite`` if the database refused its data
  (it fails alone: the other writes of its commit go through), ``StoreUnavailable`` if the
  database stayed unavailable for longer than the store's retry time (the submission may or
  may not be in the log: reload it). Submissions
  for one response commit in submission order, and one that fails makes the later ones for the
  same response fail too (their ``expected_seq`` is no longer next). A submission is written
  even if its future is cancelled: an append-only log cannot take it back.
- ``token_ids`` (``submit``, ``submit_then``): the output token ids that produced these events,
  durable with them (``output_tokens`` returns them all, in order: what a takeover replays).
  On PostgreSQL an append also fails with ``Fenced`` once another replica ``claim``-ed the
  response (its epoch moved on).
- ``submit_then(response_id, events, expected_seq, done)`` is ``submit`` with a callback instead
  of a future: ``done(None)`` once the events are durable, ``done(error)`` with what the future
  would raise. ``done`` runs later on the event loop, never inside ``submit_then``; an exception
  it raises is logged, never let into the store. (No future and no loop callback per submission:
  an engine that paces its tokens makes one submission per token per response.)
- Malformed submissions (seqs not contiguous from ``expected_seq``, an event after a terminal
  event, a payload that is not JSON) are programming errors: ``submit`` raises ``ValueError``
  (or ``TypeError``) at once.

Reads return copies: mutating what ``load`` returns never changes the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

from persistence.conversations import ConversationStore
from persistence.health import StoreHealth
from persistence.item_index import LocatedItem
from persistence.lifecycle import TERMINAL_EVENT_TYPES
from persistence.listing import ResponseQuery
from persistence.records import (
    ApiKeyRow,
    AuditRecord,
    ChainLink,
    JsonObject,
    NewResponse,
    Replica,
    ResponseRow,
    StoredEvent,
)

__all__ = [
    "REPLICAS_CHANNEL",
    "Completion",
    "Done",
    "EventStore",
    "Order",
    "check_submission",
    "then",
]

#: The doorbell channel rung when a replica releases its lease (the others sweep at once).
REPLICAS_CHANNEL = "ledger_replicas"

Order = Literal["asc", "desc"]
#: A ``submit_then`` callback: None once durable, else the error.
Done = Callable[[BaseException | None], None]

_log = logging.getLogger(__name__)


class Completion:
    """What a store settles in place of a submission's future when it was made with
    ``submit_then``: settling it calls ``done`` at once. The store settles it from its commit
    task, never inside ``submit_then``."""

    __slots__ = ("_done", "_settled")

    def __init__(self, done: Done) -> None:
        self._done = done
        self._settled = False

    def done(self) -> bool:
        return self._settled

    def set_result(self, result: None, /) -> None:
        self.settle(None)

    def set_exception(self, exception: BaseException, /) -> None:
        self.settle(exception)

    def settle(self, error: BaseException | None) -> None:
        """``set_result`` (``error`` None) or ``set_exception``, unless settled already: what
        the store does with a write's outcome once it is known, in one call a paced token."""
        if self._settled:
            return
        self._settled = True
        try:
            self._done(error)
        except Exception:  # the writer's bug, not the store's: the other writes still settle
            _log.exception("a submission's completion callback failed")


def then(future: asyncio.Future[None], done: Done) -> None:
    """``submit_then`` for a store whose ``submit`` returns a future."""

    def call(settled: asyncio.Future[None]) -> None:
        done(asyncio.CancelledError() if settled.cancelled() else settled.exception())

    future.add_done_callback(call)


class EventStore(Protocol):
    #: Whether writes work now; every commit and ``probe`` updates it (``persistence.health``).
    health: StoreHealth

    @property
    def conversations(self) -> ConversationStore:
        """Conversations and their item logs (``persistence.conversations``)."""
        ...

    async def probe(self) -> None:
        """Try a real write and record the outcome in ``health`` (raises nothing for an
        unavailable database)."""
        ...

    async def create_response(self, new: NewResponse) -> None: ...

    def submit_create(self, new: NewResponse) -> asyncio.Future[None]: ...

    def submit_audit(
        self, response_id: str, records: Sequence[AuditRecord]
    ) -> asyncio.Future[None]: ...

    def submit(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        token_ids: Sequence[int] = (),
    ) -> asyncio.Future[None]: ...

    def submit_then(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        done: Done,
        token_ids: Sequence[int] = (),
    ) -> None: ...

    async def append(
        self, response_id: str, events: Sequence[StoredEvent], expected_seq: int
    ) -> None: ...

    async def append_audit(self, response_id: str, records: Sequence[AuditRecord]) -> None: ...

    async def load(
        self, response_id: str, after_seq: int | None = None, limit: int | None = None
    ) -> list[StoredEvent]: ...

    async def load_after(self, afters: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        """For each response id, its events after the given seq (one query for them all)."""
        ...

    async def get(self, response_id: str) -> ResponseRow | None: ...

    async def load_times(self, response_id: str) -> list[tuple[int, str, float]]:
        """``(seq, type, recorded_at)`` of every event of the log, in order: when the server
        stored it (unix seconds: its commit's time, or its write's as it was queued for the
        commit; the audit page's timeline)."""
        ...

    async def list_responses(self, query: ResponseQuery) -> tuple[list[ResponseRow], bool]:
        """A page of the responses ``query`` selects (``persistence.listing``), newest first,
        and whether more follow. Every project's: the caller scopes."""
        ...

    async def load_chain(self, response_id: str, *, project: str | None = None) -> list[ChainLink]:
        """The chain ending at ``response_id``, oldest first. ``project``: ``NotFound`` if any
        response of the chain belongs to another project (as if it did not exist)."""
        ...

    async def load_audit(self, response_id: str) -> list[AuditRecord]: ...

    async def delete(self, response_id: str) -> bool: ...

    async def list_input_items(
        self, response_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[JsonObject], bool]: ...

    async def find_items(self, item_ids: Sequence[str], *, project: str) -> dict[str, LocatedItem]:
        """The stored items of ``project`` with these ids, input or output items of any stored
        response (``persistence.item_index``): an id that is missing, or another project's, is
        left out. Where one id is in several places, the output item, then the newest response."""
        ...

    async def unfinished(self, *, owned_by_others_than: Sequence[str] | None = None) -> list[str]:
        """Responses whose log has no terminal event (with ``owned_by_others_than``: only
        those whose owner is not among them, or that have none)."""
        ...

    def lease(self, replica: Replica, lease_s: float) -> None:
        """From now on ``probe`` renews this replica's lease (the heartbeat)."""

    async def replicas(self) -> list[Replica]: ...

    async def release(self, replica_id: str) -> None: ...

    # Takeover (``app.takeover``) and cross-replica cancel.

    async def claim(self, response_id: str, from_owner: str | None, to_owner: str) -> int | None:
        """Move an unfinished response from ``from_owner`` to ``to_owner`` (epoch + 1, which
        fences the old owner's appends out); the new epoch, or None if the claim was lost."""
        ...

    async def output_tokens(self, response_id: str) -> list[int]:
        """The output token ids behind the logged events (each append's ``token_ids``)."""
        ...

    async def output_token_writes(self, response_id: str) -> list[list[int]]:
        """``output_tokens``, one list for each append that carried some, in order: a writer
        whose builder coalesces (``domain.builder``) made one delta of each append's text, and
        a takeover replays them append by append (``domain.continuation``)."""
        ...

    async def request_cancel(self, response_id: str) -> bool: ...

    async def cancel_requests(self, owner: str) -> list[str]: ...

    # API keys (``app.keys``): only the SHA-256 of a key is stored.

    async def create_api_key(self, key: ApiKeyRow) -> None: ...

    async def find_api_key(self, secret_hash: str) -> ApiKeyRow | None: ...

    async def list_api_keys(self) -> list[ApiKeyRow]: ...

    async def revoke_api_key(self, key_id: str) -> bool:
        """Mark the key revoked; False if there is no such key or it already was."""
        ...

    async def get_or_create_secret(self, name: str, factory: Callable[[], bytes]) -> bytes: ...

    async def close(self) -> None: ...


def check_submission(events: Sequence[StoredEvent], expected_seq: int) -> None:
    """Raise ValueError unless ``events`` is a well-formed append at ``expected_seq``."""
    if expected_seq < 0:
        raise ValueError(f"expected_seq must be >= 0, got {expected_seq}")
    if not events:
        raise ValueError("an append needs at least one event")
    for offset, event in enumerate(events):
        if event.seq != expected_seq + offset:
            raise ValueError(
                f"event seqs must run {expected_seq}, {expected_seq + 1}, ...; "
                f"event {offset} has seq {event.seq}"
            )
        if event.type in TERMINAL_EVENT_TYPES and offset != len(events) - 1:
            raise ValueError(f"{event.type} must be the last event of a log")

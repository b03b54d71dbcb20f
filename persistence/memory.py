"""An event store held in this process: ``store=false`` responses, and the tests.

It keeps the same contract as ``SqlStore`` (one contract suite runs against both), including
its JSON semantics: payloads are kept as JSON text and decoded on every read, so what a caller
gets back is a copy that equals what a SQL store would return.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from persistence.conversations import MemoryConversations
from persistence.errors import ConcurrencyError, NotFound, StoreError
from persistence.health import StoreHealth
from persistence.item_index import IndexRow, LocatedItem, input_rows, output_row
from persistence.lifecycle import (
    OUTPUT_ITEM_DONE,
    TERMINAL_EVENT_TYPES,
    initial_status,
    row_update,
)
from persistence.listing import ResponseQuery, matches
from persistence.records import (
    ApiKeyRow,
    AuditRecord,
    ChainLink,
    JsonObject,
    NewResponse,
    Replica,
    ResponseRow,
    StoredEvent,
    dump_json,
    item_id,
    pack_token_ids,
    unpack_token_ids,
)
from persistence.store import Done, Order, check_submission, then

__all__ = ["MemoryStore"]


def _settled(write: Callable[..., None], *args: Any) -> asyncio.Future[None]:
    """Run ``write`` now and return its outcome as a done future: the store's refusals
    (``StoreError``) are the future's exception, anything else is raised at once."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    try:
        write(*args)
    except StoreError as exc:
        future.set_exception(exc)
    else:
        future.set_result(None)
    return future


@dataclass(frozen=True, slots=True)
class _Event:
    seq: int
    type: str
    payload_json: str
    recorded_at: float = 0.0

    def stored(self) -> StoredEvent:
        return StoredEvent(self.seq, self.type, None, self.payload_json)


@dataclass(frozen=True, slots=True)
class _Audit:
    kind: str
    token_ids: bytes
    detail_json: str | None

    def record(self) -> AuditRecord:
        detail = None if self.detail_json is None else json.loads(self.detail_json)
        return AuditRecord(self.kind, unpack_token_ids(self.token_ids), detail)


@dataclass(frozen=True, slots=True)
class _InputItem:
    id: str
    item_json: str


class MemoryStore:
    """Every write is durable (for the life of the process) as soon as it is accepted."""

    def __init__(self) -> None:
        self._rows: dict[str, ResponseRow] = {}
        self._events: dict[str, list[_Event]] = {}
        self._audit: dict[str, list[_Audit]] = {}
        self._inputs: dict[str, list[_InputItem]] = {}
        self._secrets: dict[str, bytes] = {}
        self._keys: dict[str, ApiKeyRow] = {}
        self._closed = False
        #: Always healthy: this process's memory is the whole store.
        self.health = StoreHealth(retry_s=0)
        self._owners: dict[str, str | None] = {}
        #: Each append's output token ids (those that carried some).
        self._tokens: dict[str, list[tuple[int, ...]]] = {}
        self._replica: tuple[Replica, float] | None = None
        #: ``item_index``: item id -> where it is (rows in the order they were written)
        self._index: dict[str, list[IndexRow]] = {}
        #: Conversations and their item logs (``persistence.conversations``).
        self.conversations = MemoryConversations()

    async def create_response(self, new: NewResponse) -> None:
        await self.submit_create(new)

    def submit_create(self, new: NewResponse) -> asyncio.Future[None]:
        return _settled(self._create, new)

    def _create(self, new: NewResponse) -> None:
        self._check_open()
        if new.id in self._rows:
            raise ConcurrencyError(f"response {new.id!r} already exists")
        inputs = [
            _InputItem(item_id(item, position), dump_json(item))
            for position, item in enumerate(new.input_items)
        ]
        self._rows[new.id] = ResponseRow(
            id=new.id,
            model=new.model,
            status=initial_status(new.background),
            created_at=new.created_at,
            completed_at=None,
            previous_response_id=new.previous_response_id,
            background=new.background,
            input_tokens=None,
            output_tokens=None,
            reasoning_tokens=None,
            error_code=None,
            incomplete_reason=None,
            request=json.loads(dump_json(new.request)),
            last_seq=-1,
            project=new.project,
            api_key_id=new.api_key_id,
            owner=new.owner,
        )
        self._owners[new.id] = new.owner
        self._tokens[new.id] = []
        self._events[new.id] = []
        self._audit[new.id] = []
        self._inputs[new.id] = inputs
        self._add_index(input_rows(new.id, new.input_items))

    def submit(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        token_ids: Sequence[int] = (),
    ) -> asyncio.Future[None]:
        self._check_open()
        check_submission(events, expected_seq)
        now = time.time()
        encoded = [_Event(e.seq, e.type, e.payload_text(), now) for e in events]
        return _settled(self._append, response_id, events, encoded, expected_seq, token_ids)

    def submit_then(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        expected_seq: int,
        done: Done,
        token_ids: Sequence[int] = (),
    ) -> None:
        then(self.submit(response_id, events, expected_seq, token_ids), done)

    def _append(
        self,
        response_id: str,
        events: Sequence[StoredEvent],
        encoded: list[_Event],
        expected_seq: int,
        token_ids: Sequence[int] = (),
    ) -> None:
        row = self._rows.get(response_id)
        if row is None:
            raise NotFound(f"no response {response_id!r}")
        log = self._events[response_id]
        if log and log[-1].type in TERMINAL_EVENT_TYPES:
            raise ConcurrencyError(f"the log of {response_id!r} has ended")
        if expected_seq != len(log):
            raise ConcurrencyError(
                f"response {response_id!r}: expected_seq {expected_seq}, next seq is {len(log)}"
            )
        log.extend(encoded)
        self._add_index(
            row
            for row in (output_row(response_id, e) for e in events if e.type == OUTPUT_ITEM_DONE)
            if row
        )
        if token_ids:
            self._tokens[response_id].append(unpack_token_ids(pack_token_ids(token_ids)))
        for event in events:
            update = row_update(event)
            if update is not None:
                row = dataclasses.replace(row, **dataclasses.asdict(update))
        self._rows[response_id] = dataclasses.replace(row, last_seq=len(log) - 1)

    async def append(
        self, response_id: str, events: Sequence[StoredEvent], expected_seq: int
    ) -> None:
        await self.submit(response_id, events, expected_seq)

    async def append_audit(self, response_id: str, records: Sequence[AuditRecord]) -> None:
        await self.submit_audit(response_id, records)

    def submit_audit(
        self, response_id: str, records: Sequence[AuditRecord]
    ) -> asyncio.Future[None]:
        return _settled(self._append_audit, response_id, records)

    def _append_audit(self, response_id: str, records: Sequence[AuditRecord]) -> None:
        self._check_open()
        encoded = [
            _Audit(
                r.kind,
                pack_token_ids(r.token_ids),
                None if r.detail is None else dump_json(r.detail),
            )
            for r in records
        ]
        if response_id not in self._rows:
            raise NotFound(f"no response {response_id!r}")
        self._audit[response_id].extend(encoded)

    async def load(
        self, response_id: str, after_seq: int | None = None, limit: int | None = None
    ) -> list[StoredEvent]:
        self._check_open()
        log = self._events.get(response_id, [])
        start = 0 if after_seq is None else max(after_seq + 1, 0)
        end = None if limit is None else start + limit
        return [event.stored() for event in log[start:end]]

    async def load_times(self, response_id: str) -> list[tuple[int, str, float]]:
        self._check_open()
        return [(e.seq, e.type, e.recorded_at) for e in self._events.get(response_id, [])]

    async def list_responses(self, query: ResponseQuery) -> tuple[list[ResponseRow], bool]:
        self._check_open()
        turns = self.conversations.turns(query.conversation) if query.conversation else set()
        rows = sorted(
            (row for row in self._rows.values() if matches(row, query, turns)),
            key=lambda row: (row.created_at, row.id),
            reverse=True,
        )
        page = [
            dataclasses.replace(row, request=json.loads(dump_json(row.request)))
            for row in rows[query.offset : query.offset + query.limit + 1]
        ]
        return page[: query.limit], len(page) > query.limit

    async def load_after(self, afters: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        self._check_open()
        return {
            rid: [e.stored() for e in self._events.get(rid, [])[max(after + 1, 0) :]]
            for rid, after in afters.items()
        }

    async def get(self, response_id: str) -> ResponseRow | None:
        self._check_open()
        row = self._rows.get(response_id)
        if row is None:
            return None
        return dataclasses.replace(row, request=json.loads(dump_json(row.request)))

    async def load_chain(self, response_id: str, *, project: str | None = None) -> list[ChainLink]:
        self._check_open()
        links: list[ChainLink] = []
        seen: set[str] = set()
        current: str | None = response_id
        while current is not None:
            if current in seen:
                raise StoreError(f"previous_response_id cycle at {current!r}")
            seen.add(current)
            row = await self.get(current)
            if row is None or (project is not None and row.project != project):
                raise NotFound(f"no response {current!r} (in the chain of {response_id!r})")
            log = self._events[current]
            if log and log[-1].type in TERMINAL_EVENT_TYPES:
                events = [log[-1].stored()]
            else:
                events = [e.stored() for e in log if e.type == OUTPUT_ITEM_DONE]
            items = [json.loads(i.item_json) for i in self._inputs[current]]
            links.append(ChainLink(row, items, events))
            current = row.previous_response_id
        links.reverse()
        return links

    async def load_audit(self, response_id: str) -> list[AuditRecord]:
        self._check_open()
        return [a.record() for a in self._audit.get(response_id, [])]

    async def delete(self, response_id: str) -> bool:
        self._check_open()
        if self._rows.pop(response_id, None) is None:
            return False
        del self._events[response_id], self._audit[response_id], self._inputs[response_id]
        del self._tokens[response_id]
        for ident in [
            i for i, rows in self._index.items() if any(r[1] == response_id for r in rows)
        ]:
            kept = [r for r in self._index[ident] if r[1] != response_id]
            if kept:
                self._index[ident] = kept
            else:
                del self._index[ident]
        return True

    def _add_index(self, rows: Iterable[IndexRow]) -> None:
        for row in rows:
            self._index.setdefault(row[0], []).append(row)

    async def find_items(self, item_ids: Sequence[str], *, project: str) -> dict[str, LocatedItem]:
        self._check_open()
        found: dict[str, LocatedItem] = {}
        for ident in item_ids:
            candidates = [
                (source == "output", self._rows[rid].created_at, n, rid, source, position, seq)
                for n, (_, rid, source, position, seq) in enumerate(self._index.get(ident, ()))
                if self._rows[rid].project == project
            ]
            if not candidates:
                continue
            *_, rid, source, position, seq = max(candidates)
            if source == "output":
                event = self._events[rid][seq if seq is not None else -1]
                item = json.loads(event.payload_json)["item"]
                found[ident] = LocatedItem(rid, "output", position, item)
            else:
                item = json.loads(self._inputs[rid][position].item_json)
                found[ident] = LocatedItem(rid, "input", position, item)
        return found

    async def list_input_items(
        self, response_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[JsonObject], bool]:
        self._check_open()
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        items = self._inputs.get(response_id)
        if items is None:
            raise NotFound(f"no response {response_id!r}")
        positions = list(range(len(items)))
        if after is not None:
            cursor = next((p for p, i in enumerate(items) if i.id == after), None)
            if cursor is None:
                raise NotFound(f"no input item {after!r} in response {response_id!r}")
            positions = positions[cursor + 1 :] if order == "asc" else positions[:cursor]
        if order == "desc":
            positions.reverse()
        page = [json.loads(items[p].item_json) for p in positions[:limit]]
        return page, len(positions) > limit

    async def unfinished(self, *, owned_by_others_than: Sequence[str] | None = None) -> list[str]:
        self._check_open()
        live = set(owned_by_others_than or ())
        return [
            row.id
            for row in sorted(self._rows.values(), key=lambda r: (r.created_at, r.id))
            if not self._ended(row.id)
            and (owned_by_others_than is None or self._owners.get(row.id) not in live)
        ]

    def lease(self, replica: Replica, lease_s: float) -> None:
        self._replica = (replica, lease_s)

    async def replicas(self) -> list[Replica]:
        self._check_open()
        if self._replica is None:
            return []
        replica, lease_s = self._replica
        now = time.time()
        return [dataclasses.replace(replica, heartbeat_at=now, expires_at=now + lease_s)]

    async def release(self, replica_id: str) -> None:
        self._check_open()
        if self._replica is not None and self._replica[0].id == replica_id:
            self._replica = None

    async def claim(self, response_id: str, from_owner: str | None, to_owner: str) -> int | None:
        self._check_open()
        row = self._rows.get(response_id)
        if row is None or self._ended(response_id) or self._owners.get(response_id) != from_owner:
            return None
        self._owners[response_id] = to_owner
        self._rows[response_id] = dataclasses.replace(row, owner=to_owner, epoch=row.epoch + 1)
        return row.epoch + 1

    async def output_tokens(self, response_id: str) -> list[int]:
        return [token for write in await self.output_token_writes(response_id) for token in write]

    async def output_token_writes(self, response_id: str) -> list[list[int]]:
        self._check_open()
        return [list(write) for write in self._tokens.get(response_id, ())]

    async def request_cancel(self, response_id: str) -> bool:
        self._check_open()
        row = self._rows.get(response_id)
        if row is None or self._ended(response_id):
            return False
        self._rows[response_id] = dataclasses.replace(row, cancel_requested_at=time.time())
        return True

    async def cancel_requests(self, owner: str) -> list[str]:
        self._check_open()
        return [
            rid
            for rid, row in self._rows.items()
            if self._owners.get(rid) == owner
            and row.cancel_requested_at is not None
            and not self._ended(rid)
        ]

    def _ended(self, response_id: str) -> bool:
        log = self._events[response_id]
        return bool(log) and log[-1].type in TERMINAL_EVENT_TYPES

    async def get_or_create_secret(self, name: str, factory: Callable[[], bytes]) -> bytes:
        self._check_open()
        if name not in self._secrets:
            self._secrets[name] = bytes(factory())
        return self._secrets[name]

    async def create_api_key(self, key: ApiKeyRow) -> None:
        self._check_open()
        if key.id in self._keys or any(
            k.secret_hash == key.secret_hash for k in self._keys.values()
        ):
            raise ConcurrencyError(f"API key {key.id!r} already exists")
        self._keys[key.id] = key

    async def find_api_key(self, secret_hash: str) -> ApiKeyRow | None:
        self._check_open()
        return next((k for k in self._keys.values() if k.secret_hash == secret_hash), None)

    async def list_api_keys(self) -> list[ApiKeyRow]:
        self._check_open()
        return sorted(self._keys.values(), key=lambda k: (k.project, k.created_at, k.id))

    async def revoke_api_key(self, key_id: str) -> bool:
        self._check_open()
        key = self._keys.get(key_id)
        if key is None or key.revoked_at is not None:
            return False
        self._keys[key_id] = dataclasses.replace(key, revoked_at=time.time())
        return True

    async def probe(self) -> None:
        self._check_open()
        self.health.succeeded()

    async def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

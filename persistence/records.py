"""The values that cross the persistence boundary.

The domain serialises events itself; the store sees an event as ``(seq, type, payload)``.
Payloads are JSON objects; a caller that already has the JSON text passes it as
``payload_json`` and the SQL store writes it verbatim, so a streamed token is serialised once.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AuditRecord",
    "ChainLink",
    "JsonObject",
    "NewResponse",
    "ResponseRow",
    "StoredEvent",
    "dump_json",
    "pack_token_ids",
    "unpack_token_ids",
]

JsonObject = dict[str, Any]


def dump_json(value: Any) -> str:
    """Compact JSON text; NaN and infinities are refused because PostgreSQL refuses them."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One entry of a response's log: the wire event without ``type``/``sequence_number``."""

    seq: int
    type: str
    payload: JsonObject
    # The exact JSON text of ``payload`` when the caller has it (stored verbatim). Events
    # loaded back always carry it: SQLite returns the text as written, PostgreSQL the JSONB
    # rendering (same value; key order and spacing may differ).
    payload_json: str | None = None

    def payload_text(self) -> str:
        return self.payload_json if self.payload_json is not None else dump_json(self.payload)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A record kept with a response but never streamed and never given a ``seq``."""

    kind: str  # "prompt_token_ids" | "output_token_ids" | "finish"
    token_ids: tuple[int, ...] = ()
    detail: JsonObject | None = None


@dataclass(frozen=True, slots=True)
class NewResponse:
    id: str
    model: str
    created_at: int  # unix seconds
    previous_response_id: str | None
    background: bool
    request: JsonObject  # the request body as received
    input_items: list[JsonObject]  # normalised input items, each with an "id"


@dataclass(frozen=True, slots=True)
class ResponseRow:
    """The ``responses`` row: what an operator filters on, kept in step with the log."""

    id: str
    model: str
    status: str
    created_at: int
    completed_at: int | None
    previous_response_id: str | None
    background: bool
    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    error_code: str | None
    incomplete_reason: str | None
    request: JsonObject
    last_seq: int  # -1 while the log is empty


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One response of a ``previous_response_id`` chain, as needed to replay it.

    ``events`` holds only this response's ``response.output_item.done`` events and its
    terminal event, in ``seq`` order.
    """

    row: ResponseRow
    input_items: list[JsonObject]
    events: list[StoredEvent]


# Token ids are stored as unsigned 32-bit little-endian integers: 4 bytes a token, readable
# from SQL as length(token_ids) / 4 and from Python with array("I").frombytes.
_TOKEN_TYPECODE = "I"
assert array(_TOKEN_TYPECODE).itemsize == 4, "this platform's C unsigned int is not 32 bits"


def pack_token_ids(token_ids: Iterable[int]) -> bytes:
    """Token ids as uint32 little-endian bytes; raises OverflowError outside [0, 2**32)."""
    packed = array(_TOKEN_TYPECODE, token_ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_token_ids(data: bytes) -> tuple[int, ...]:
    packed = array(_TOKEN_TYPECODE)
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return tuple(packed)

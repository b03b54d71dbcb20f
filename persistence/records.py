"""The values that cross the persistence boundary.

The domain serialises events itself; the store sees an event as ``(seq, type, payload)``.
Payloads are JSON objects; a caller that already has the JSON text passes it as
``payload_json`` and the SQL store writes it verbatim, so a streamed token is serialised once.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_PROJECT",
    "ApiKeyRow",
    "AuditRecord",
    "ChainLink",
    "JsonObject",
    "NewResponse",
    "Replica",
    "ResponseRow",
    "StoredEvent",
    "check_encodable",
    "check_json_text",
    "dump_json",
    "item_id",
    "pack_token_ids",
    "unpack_token_ids",
]

JsonObject = dict[str, Any]

#: The project of every response made before projects existed, and of requests served without
#: keys (a loopback server run open, as ``make serve`` does).
DEFAULT_PROJECT = "default"


def dump_json(value: Any) -> str:
    """Compact JSON text that every backend can store.

    Refused with ValueError, on every backend alike so that a response behaves the same
    whatever the store: NaN and infinities (not JSON), U+0000 (PostgreSQL's JSONB cannot
    hold it) and lone surrogates (not UTF-8: no driver can send them); TypeError for values
    that are not JSON at all.
    """
    return check_encodable(
        check_json_text(
            json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        )
    )


def check_encodable(text: str) -> str:
    """Return ``text`` unless it cannot be encoded as UTF-8 (a lone surrogate, which JSON's
    ``\\udXXX`` escapes can carry): checked when a write is submitted, so such a row never
    reaches, and fails, a commit it shares with other responses."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise ValueError(f"text holding a lone surrogate ({bad!r}) cannot be stored") from None
    return text


# An escaped NUL (\u0000) that is not itself the tail of an escaped backslash.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_json_text(text: str) -> str:
    """Return ``text`` unless it holds a U+0000 character (see ``dump_json``)."""
    if "\x00" in text or ("\\u0000" in text and _ESCAPED_NUL.search(text)):
        raise ValueError("JSON holding U+0000 cannot be stored (PostgreSQL JSONB refuses it)")
    return text


class StoredEvent:
    """One entry of a response's log: the wire event without ``type``/``sequence_number``.

    Give ``payload`` (the JSON object), ``payload_json`` (its exact JSON text), or both. The
    text, when given, is what the SQL store writes, verbatim; the object is made from it only
    when somebody reads ``payload`` (a streamed token is written, never read back as a dict).
    Events loaded back always carry the text, as written (on PostgreSQL, events written before
    migration 0011 come back in ``jsonb``'s rendering: the same value, keys reordered and spaced).

    Immutable, like a frozen dataclass: equal when ``seq``, ``type`` and ``payload`` are.
    """

    __slots__ = ("_payload", "payload_json", "seq", "type")

    seq: int
    type: str
    payload_json: str | None
    _payload: JsonObject | None

    def __init__(
        self,
        seq: int,
        type: str,
        payload: JsonObject | None = None,
        payload_json: str | None = None,
    ) -> None:
        if payload is None and payload_json is None:
            raise TypeError("StoredEvent needs payload or payload_json")
        _set_seq(self, seq)
        _set_type(self, type)
        _set_payload_json(self, payload_json)
        _set_payload(self, payload)

    @property
    def payload(self) -> JsonObject:
        payload = self._payload
        if payload is None:
            assert self.payload_json is not None
            payload = json.loads(self.payload_json)
            _set_payload(self, payload)
        return payload

    def payload_text(self) -> str:
        """The JSON text to store (``payload_json`` when given, checked but not rewritten)."""
        text = self.payload_json
        if text is None:
            return dump_json(self.payload)
        if "\x00" in text or "\\u0000" in text:  # (the common case of ``check_json_text``, inlined:
            return check_json_text(text)  # a call a paced token)
        return text

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"StoredEvent is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"StoredEvent is immutable (cannot delete {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredEvent):
            return NotImplemented
        return self.seq == other.seq and self.type == other.type and self.payload == other.payload

    __hash__ = None  # type: ignore[assignment]  # equal payloads need not have equal texts

    def __repr__(self) -> str:
        return f"StoredEvent(seq={self.seq!r}, type={self.type!r}, payload={self.payload!r})"


_set_seq = StoredEvent.__dict__["seq"].__set__
_set_type = StoredEvent.__dict__["type"].__set__
_set_payload_json = StoredEvent.__dict__["payload_json"].__set__
_set_payload = StoredEvent.__dict__["_payload"].__set__


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
    project: str = DEFAULT_PROJECT  # whose it is: only this project's keys can see it
    api_key_id: str | None = None  # the key that made it (None: the static key, or no key)
    owner: str | None = None  # the replica generating it (see ``Replica``)


@dataclass(frozen=True, slots=True)
class Replica:
    """A server process's lease: ``expires_at`` (unix seconds) is renewed every heartbeat."""

    id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    expires_at: float


def item_id(item: JsonObject, position: int) -> str:
    """The ``id`` of a normalised input item (ValueError if it has none)."""
    value = item.get("id")
    if not isinstance(value, str) or not value:
        raise ValueError(f"input item {position} has no string id")
    return value


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
    project: str = DEFAULT_PROJECT
    api_key_id: str | None = None
    owner: str | None = None  # the replica generating it (or that last did)
    epoch: int = 0  # bumped by every takeover claim
    cancel_requested_at: float | None = None  # a cancel asked through another replica


@dataclass(frozen=True, slots=True)
class ApiKeyRow:
    """An API key as stored: never the key itself, only its SHA-256 (``secret_hash``, hex)."""

    id: str
    project: str
    role: str  # "admin" | "member"
    name: str | None
    secret_hash: str
    created_at: float  # unix seconds
    revoked_at: float | None = None
    #: Limits set on the key (None: unlimited).
    max_streams: int | None = None
    requests_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One response of a ``previous_response_id`` chain, as needed to replay it.

    ``events``: an ended response's terminal event alone (its snapshot holds the whole
    output); for one still generating, its ``response.output_item.done`` events so far, in
    ``seq`` order (a long chain is replayed without reading every delta of every turn).
    """

    row: ResponseRow
    input_items: list[JsonObject]
    events: list[StoredEvent]


# Token ids are stored as unsigned 32-bit little-endian integers: 4 bytes a token, readable
# from SQL as length(token_ids) / 4 and from Python with array("I").frombytes.
_TOKEN_TYPECODE = "I"
assert array(_TOKEN_TYPECODE).itemsize == 4, "this platform's C unsigned int is not 32 bits"


_PACK_ONE = struct.Struct("<I").pack


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as uint32 little-endian bytes; raises OverflowError outside [0, 2**32)."""
    if len(token_ids) == 1:
        try:  # a paced engine's one token a step: a quarter of array()'s cost
            return _PACK_ONE(token_ids[0])
        except struct.error:
            pass  # array() raises what it raises for it
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

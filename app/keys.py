"""API keys: what a key is, how a presented key is checked, and the ``keys`` CLI actions.

- A key is ``sk-rl-`` + 43 characters (32 random bytes, URL-safe base64): 256 bits, printed
  once by ``responses-ledger keys create`` and never stored. The database keeps its SHA-256.
  A fast hash is enough for a random key of that size (a slow one protects guessable
  passwords; no one can search 2**256 keys), and it keeps the check far under the 50 us a
  request may spend on it: bcrypt or scrypt would cost milliseconds per request.
- A presented key is hashed, the hash is looked up (in this process's cache, then in the
  database by its unique index) and the stored hash is compared with ``hmac.compare_digest``.
  The static key (``RESPONSES_LEDGER_API_KEY``) is compared the same way, hash to hash.
- Verified keys are cached, hash -> caller, for ``key_cache_s`` seconds: a revocation reaches
  every running server within that time. Unknown and revoked hashes are not cached, so a flood
  of wrong keys cannot evict the good ones (each costs one indexed read).
- Keys never reach a log: nothing here formats one, and a caller carries only the key's id.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from persistence.records import DEFAULT_PROJECT, ApiKeyRow
from persistence.store import EventStore

__all__ = [
    "OPEN_CALLER",
    "ROLES",
    "STATIC_CALLER",
    "Caller",
    "KeyRing",
    "create_key",
    "hash_key",
    "is_loopback",
    "keys_required",
    "new_key",
]

ROLES = ("admin", "member")
_PREFIX = "sk-rl-"
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from: its project, its role there, and the key's limits."""

    project: str
    role: str  # "admin" | "member"
    key_id: str | None  # None: the static key, or a server run open
    max_streams: int | None = None
    requests_per_minute: int | None = None

    def may_read(self, project: str, *, audit: bool = False) -> bool:
        """Members see their project; admins may also read any project's audit endpoints."""
        return project == self.project or (audit and self.role == "admin")


#: Every request of a server run open (no keys): the default project, as before keys existed.
OPEN_CALLER = Caller(DEFAULT_PROJECT, "admin", None)
#: The static key's caller (``RESPONSES_LEDGER_API_KEY``).
STATIC_CALLER = Caller(DEFAULT_PROJECT, "admin", None)


def new_key() -> str:
    return _PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def keys_required(required: bool | None, static_key: str | None, store: EventStore) -> bool:
    """The setting when given; else whether there is a static key or an unrevoked stored key."""
    if required is not None:
        return required
    if static_key:
        return True
    return any(key.revoked_at is None for key in await store.list_api_keys())


class KeyRing:
    """Checks presented keys (see the module docstring)."""

    def __init__(
        self,
        store: EventStore,
        *,
        required: bool,
        static_key: str | None = None,
        cache_s: float = 10.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.required = required
        self._store = store
        self._static = hash_key(static_key) if static_key else None
        self._cache_s = cache_s
        self._cache_size = cache_size
        self._clock = clock
        self._cache: OrderedDict[str, tuple[Caller, float]] = OrderedDict()

    async def authenticate(self, presented: str) -> Caller | None:
        """The caller a key belongs to, or None (unknown, revoked). May raise ``StoreError``
        when the key is not cached and the database cannot be read."""
        digest = hash_key(presented)
        if self._static is not None and hmac.compare_digest(digest, self._static):
            return STATIC_CALLER
        hit = self._cache.get(digest)
        now = self._clock()
        if hit is not None:
            if hit[1] > now:
                return hit[0]
            del self._cache[digest]
        row = await self._store.find_api_key(digest)
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(row.secret_hash, digest):
            return None
        caller = Caller(row.project, row.role, row.id, row.max_streams, row.requests_per_minute)
        self._cache[digest] = (caller, now + self._cache_s)
        while len(self._cache) > self._cache_size:  # the oldest verification goes first
            self._cache.popitem(last=False)
        return caller


async def create_key(
    store: EventStore,
    *,
    project: str,
    role: str = "member",
    name: str | None = None,
    max_streams: int | None = None,
    requests_per_minute: int | None = None,
) -> tuple[ApiKeyRow, str]:
    """Store a new key for ``project``; return its row and the key (shown once, never stored)."""
    if not _PROJECT.fullmatch(project):
        raise ValueError(
            f"project {project!r}: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    for label, limit in (
        ("max streams", max_streams),
        ("requests per minute", requests_per_minute),
    ):
        if limit is not None and limit < 1:
            raise ValueError(f"{label} must be at least 1 (leave it out for no limit)")
    key = new_key()
    row = ApiKeyRow(
        id=f"key_{secrets.token_hex(8)}",
        project=project,
        role=role,
        name=name,
        secret_hash=hash_key(key),
        created_at=time.time(),
        max_streams=max_streams,
        requests_per_minute=requests_per_minute,
    )
    await store.create_api_key(row)
    return row, key

"""Errors raised by the event stores.

A small tree that ``app/`` maps to OpenAI's ``{"error": {...}}`` JSON in one place:

- ``StoreError``: the store could not do what was asked (database down, store closed, ...).
- ``ConcurrencyError``: another writer got there first: the expected ``seq`` is taken or not
  next, the log already ended, or the response id already exists.
- ``Fenced``: another replica took the response over; this one may no longer append to it.
- ``NotFound``: the response (or a link of its chain, or a list cursor) does not exist.
- ``StoreUnavailable``: the database cannot be reached or written (down, frozen, read-only,
  full, locked) and stayed so for longer than the store's retry time.
- ``RefusedWrite``: the database (or its driver) refused one submission's data; the other writes
  of its commit went through.
"""

from __future__ import annotations

__all__ = [
    "ConcurrencyError",
    "Fenced",
    "NotFound",
    "RefusedWrite",
    "StoreError",
    "StoreUnavailable",
]


class StoreError(Exception):
    """The store failed; the operation may or may not have taken effect if it was a write
    whose commit was interrupted (the log, reloaded, is the truth)."""


class ConcurrencyError(StoreError):
    """An append lost a race or was built on a stale view of the log."""


class Fenced(ConcurrencyError):
    """This store no longer owns the response: another replica claimed it (a takeover bumped its
    epoch), so this one's appends are refused. The other replica goes on with the log."""


class NotFound(StoreError):
    """No such response (or chain link, or input item cursor)."""


class StoreUnavailable(StoreError):
    """The database could not be reached or written for longer than the retry time allowed.
    ``reason`` says what the last attempt ran into, in words an operator can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the database is unavailable: {reason}")
        self.reason = reason


class RefusedWrite(StoreError):
    """The database or its driver refused this submission's rows (they can never be written)."""

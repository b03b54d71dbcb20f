"""Errors raised by the event stores.

A small tree that ``app/`` maps to OpenAI's ``{"error": {...}}`` JSON in one place:

- ``StoreError``: the store could not do what was asked (database down, store closed, ...).
- ``ConcurrencyError``: another writer got there first: the expected ``seq`` is taken or not
  next, the log already ended, or the response id already exists.
- ``NotFound``: the response (or a link of its chain, or a list cursor) does not exist.
"""

from __future__ import annotations

__all__ = ["ConcurrencyError", "NotFound", "StoreError"]


class StoreError(Exception):
    """The store failed; the operation may or may not have taken effect if it was a write
    whose commit was interrupted (the log, reloaded, is the truth)."""


class ConcurrencyError(StoreError):
    """An append lost a race or was built on a stale view of the log."""


class NotFound(StoreError):
    """No such response (or chain link, or input item cursor)."""

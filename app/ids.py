"""Ids: the ids this server gives responses, items and conversations, in the order it made them.

``new_id("resp")`` is ``resp_`` and 48 hex digits, as OpenAI's are, and like OpenAI's the first 8
are the Unix time in seconds (``resp_67ccd2be...`` was made on 2025-03-08). The next 5 are the
microseconds within that second, the last 35 are random (140 bits, from ``os.urandom``). Within
one process the time part only goes up (two ids in one microsecond, or a clock set back, take the
last one's plus one), so an id made later sorts after every id made before; across replicas, to
within their clocks' difference. Nobody can guess one.

Why the order matters: every table keyed by a response's or an item's id (the responses, their
events' ``(response_id, seq)`` key, input items, audit records, the item index) takes a new
response's rows in a B-tree. Random ids put each new response on a leaf page of its own in each of
them; ids in creation order put a commit's new responses side by side on the last leaves. SQLite
writes a whole page to its WAL (and later to the database) for each page a commit changes: with
random ids a 2-token response wrote 118 KB, with these 49 KB, its system CPU fell by a quarter
and the p99 of 64 streams of such responses from 43-56 to 24-29 ms (bench/RESULTS.md,
twenty-fourth session). PostgreSQL logs rows, not pages: no change measured there on a fresh
database (a large table's random inserts would read leaf pages from disk once its indexes no
longer fit in memory; not measured).

The random part comes from a buffer of ``os.urandom`` bytes, refilled 4 KiB at a time: each
``os.urandom`` call releases the GIL, and with SQLite's writer thread on the same core the event
loop then waited up to its switch interval to get it back (0.6-0.7 ms a call, twenty-third
session), several times a response. The buffer is emptied in a forked child, which must not
reuse its parent's bytes (nor inherit its lock held by a thread it does not have).
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["new_id"]

#: Random bytes an id takes (35 hex digits are used of their 36).
_RANDOM_BYTES = 18
_REFILL = 4096

_lock = threading.Lock()  # ids are made on the event loop and in worker threads (large prompts)
_buffer = b""
_offset = 0
_last_us = 0  # the time part of the last id made (microseconds since the epoch)
_clock = time.time_ns  # (a test sets the clock back here, not in the time module)


def _forget() -> None:
    """In a forked child: new random bytes, and a lock no thread of the parent can hold."""
    global _buffer, _offset, _lock
    _buffer, _offset, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def new_id(prefix: str) -> str:
    """``<prefix>_`` and 48 hex digits: the time in seconds (8), its microseconds (5), random
    (35). See the module docstring."""
    global _buffer, _offset, _last_us
    now = _clock() // 1000
    with _lock:
        start = _offset
        if start + _RANDOM_BYTES > len(_buffer):
            _buffer, start = os.urandom(_REFILL), 0
        _offset = start + _RANDOM_BYTES
        random = _buffer[start : start + _RANDOM_BYTES]
        _last_us = now = max(now, _last_us + 1)
    seconds, micros = divmod(now, 1_000_000)
    return f"{prefix}_{seconds:08x}{micros:05x}{random.hex()[:35]}"

"""Issue 14: SQLite faults: a full disk and a held write lock mid-stream, a degraded start on
a read-only or full database, and the poisoned request among 24 live streams.

The full disk is a 16 MiB tmpfs filled by a filler file (we are root: permissions would not
stop a write, so read-only is a ``remount,ro`` of that tmpfs); the write lock is a ``sqlite3``
connection of another process in ``BEGIN IMMEDIATE`` held past the server's busy timeout (5 s)
plus its retry time. Targets and contract as in ``tests/faults/expectations.py`` (the details
chosen where the shared contract left them open are listed there); here also:

* after the full disk is freed, 16 new POSTs one after another all complete (before: 13 of 16
  got 500);
* degraded start: the process starts and stays up; ``/health`` 503 with a reason; GET of a
  response stored before answers 200; POST 503 with ``Retry-After``; once the disk is writable
  again (remount rw / filler removed) ``/health`` is 200 within 30 s, POSTs complete, and the
  response a killed process left in progress is closed (``failed``) within 30 s, by start-up
  recovery run at that point.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import expectations, scenarios
from tests.faults.storage import Tmpfs

pytestmark = pytest.mark.slow

STREAMS = 8


def test_disk_full_mid_stream_then_freed(disk: Tmpfs, tmp_path: Path) -> None:
    expectations.outage(scenarios.sqlite_full(disk, tmp_path, streams=STREAMS), posts=16)


def test_write_lock_held_past_busy_timeout_and_retry(tmp_path: Path) -> None:
    run = scenarios.sqlite_lock(tmp_path, streams=STREAMS)
    expectations.outage(run)


@pytest.mark.parametrize("mode", ["readonly", "full"])
def test_degraded_start(disk: Tmpfs, tmp_path: Path, mode: str) -> None:
    expectations.degraded(scenarios.degraded_start(disk, tmp_path, mode))


def test_a_poisoned_request_harms_no_other_stream(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'poisoned.db'}"
    expectations.poisoned(scenarios.poisoned(tmp_path, url, streams=24))

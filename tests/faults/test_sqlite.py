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

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from persistence.sql import open_store
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


async def test_a_read_open_across_a_read_only_probe_does_not_keep_the_store_read_only(
    disk: Tmpfs,
) -> None:
    """The flake behind ``test_degraded_start[readonly]`` made certain: SQLite shares one
    ``-shm`` mapping among a process's connections to a file, read-only while the filesystem
    is, until every one of them is closed. A reader connection checked out while a probe found
    the disk read-only (a GET during the outage) went back to the pool that probe had thrown
    away, and stayed open: the store stayed read-only after the disk was writable again."""
    path = disk.path / "responses.db"
    url = f"sqlite+aiosqlite:///{path}"
    store = await open_store(url)
    await store.close()
    # a process killed mid-write leaves the -wal and -shm files behind (a clean close removes
    # them, and a read-only file without them opens as an immutable snapshot instead)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], capture_output=True, check=False
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert path.with_name(path.name + "-shm").exists()
    disk.readonly()
    store = await open_store(url, retry_s=1.0)
    try:
        async with store._reader.connect() as held:  # a read in progress across the probe
            await held.exec_driver_sql("SELECT count(*) FROM responses")
            await store.probe()
            assert not store.health.ok
        disk.writable()
        await store.probe()
        assert store.health.ok, store.health.reason
    finally:
        disk.writable()
        await store.close()


_KILLED_WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("UPDATE server_secrets SET created_at = created_at")
os.kill(os.getpid(), signal.SIGKILL)
"""

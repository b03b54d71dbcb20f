"""The fault harness itself: the cluster really restarts, stops and freezes (and only itself),
the tmpfs really fills up and turns read-only, the write lock is really held, and the raw SSE
reader tells a clean EOF from a terminal or ``error`` frame. Without these, a fault test could
pass because its fault never happened."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import time
from pathlib import Path

import asyncpg
import pytest

from tests.faults.outcomes import _lines, parse_sse
from tests.faults.storage import Tmpfs, WriteLock
from tests.support.pg_cluster import PgCluster
from tests.support.postgres import ADMIN_DSN

pytestmark = pytest.mark.slow


async def _select_one(dsn: str, timeout_s: float) -> int:
    connection = await asyncio.wait_for(asyncpg.connect(dsn, timeout=timeout_s), timeout_s)
    try:
        return int(await asyncio.wait_for(connection.fetchval("SELECT 1"), timeout_s))
    finally:
        connection.terminate()


def _reachable(dsn: str, timeout_s: float = 3) -> bool:
    try:
        return asyncio.run(_select_one(dsn, timeout_s)) == 1
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False


def test_the_cluster_restarts_stops_and_freezes(cluster: PgCluster) -> None:
    assert cluster.port != 5432 and _reachable(cluster.dsn)
    shared_before = _reachable(ADMIN_DSN)

    cluster.stop("fast")
    assert not cluster.running and not _reachable(cluster.dsn)
    cluster.start()
    assert _reachable(cluster.dsn)

    pid = cluster.postmaster_pid()
    cluster.restart("immediate", downtime_s=0.5)
    assert cluster.postmaster_pid() not in (None, pid) and _reachable(cluster.dsn)

    processes = cluster.processes()
    assert len(processes) >= 4  # postmaster, checkpointer, background writer, walwriter, ...
    with cluster.frozen_for():
        time.sleep(0.2)
        assert all(p.status() in ("stopped", "zombie") for p in cluster.processes())
        started = time.monotonic()
        assert not _reachable(cluster.dsn, timeout_s=1.5)  # hangs, then times out
        assert time.monotonic() - started >= 1.0
        assert _reachable(ADMIN_DSN) == shared_before  # the shared cluster is not ours to freeze
    assert _reachable(cluster.dsn)

    cluster.reset_database()
    assert _reachable(cluster.dsn)


def test_the_tmpfs_fills_up_and_turns_read_only(disk: Tmpfs) -> None:
    probe = disk.path / "probe"
    probe.write_bytes(b"x" * 4096)
    assert disk.fill() > 15 * 1024 * 1024 - 64 * 1024
    assert disk.free_bytes() == 0
    with pytest.raises(OSError) as full:
        (disk.path / "more").write_bytes(b"y" * 8192)
    assert full.value.errno == errno.ENOSPC
    disk.free()
    (disk.path / "more").write_bytes(b"y" * 8192)

    disk.readonly()
    with pytest.raises(OSError) as readonly:
        probe.write_bytes(b"z")
    assert readonly.value.errno == errno.EROFS
    assert probe.read_bytes() == b"x" * 4096  # still readable
    disk.writable()
    probe.write_bytes(b"z")


def test_the_write_lock_is_held_until_released(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    setup = sqlite3.connect(db)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (x)")
    setup.commit()
    setup.close()
    other = sqlite3.connect(db, timeout=0.3, isolation_level=None)
    with WriteLock(db):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("INSERT INTO t VALUES (1)")
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)  # readers go on
    other.execute("INSERT INTO t VALUES (1)")
    assert other.execute("SELECT count(*) FROM t").fetchone() == (1,)
    other.close()


def test_the_sse_reader_sees_frames_split_anywhere() -> None:
    raw = (
        b": ping\r\n\r\n"
        b'event: response.created\ndata: {"a": 1}\n\n'
        b"event: error\r\ndata: {\"type\": \"error\"}\r\n\r\n"
        b"event: response.completed\ndata: {\"cut\""  # no blank line: never dispatched
    )
    expected = [("response.created", '{"a": 1}'), ("error", '{"type": "error"}')]
    for size in (1, 3, 7, len(raw)):
        chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert list(parse_sse(_lines(chunks))) == expected

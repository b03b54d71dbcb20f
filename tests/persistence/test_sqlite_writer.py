"""The SQLite writer's checkpoints: off the commit path, on their own connection and thread."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persistence.sqlite_writer import SqliteWriter
from tests.support.waiting import eventually


@pytest.fixture
async def writer(migrated_sqlite_url: str) -> AsyncIterator[SqliteWriter]:
    the_writer = SqliteWriter(_path(migrated_sqlite_url), synchronous="FULL", busy_timeout_ms=5000)
    try:
        yield the_writer
    finally:
        await the_writer.close()


def _path(url: str) -> Path:
    return Path(url.split("///", 1)[1])


async def _put(writer: SqliteWriter, name: str) -> None:
    def work(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO server_secrets (name, value, created_at) VALUES (?, x'00', 0)", (name,)
        )

    await writer.transaction(work)


def _in_database_file(path: Path) -> list[str]:
    """The names in the database file itself, without its WAL: what checkpoints copied there."""
    connection = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return [
            name for (name,) in connection.execute("SELECT name FROM server_secrets ORDER BY name")
        ]
    finally:
        connection.close()


async def test_commits_are_checkpointed_by_the_checkpointer(
    writer: SqliteWriter, migrated_sqlite_url: str
) -> None:
    path = _path(migrated_sqlite_url)
    writer.checkpoint_interval_s = 3600.0
    await _put(writer, "a")
    assert _in_database_file(path) == []  # in the WAL only: no checkpoint in the commit
    writer.checkpoint_interval_s = 0.0
    await _put(writer, "b")
    await eventually(lambda: writer.checkpoints == 1, "a checkpoint")
    assert _in_database_file(path) == ["a", "b"]


async def test_a_commit_never_waits_for_a_checkpoint(
    writer: SqliteWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer.checkpoint_interval_s = 0.0
    started, release = threading.Event(), threading.Event()
    checkpoint = writer._run_checkpoint

    def slow_checkpoint() -> None:
        started.set()
        release.wait(10)
        checkpoint()

    # this writer's only: a class-wide patch would reach every writer of the process (the
    # session-scoped ledger servers of tests/e2e and tests/clients run in threads, and probe)
    monkeypatch.setattr(writer, "_run_checkpoint", slow_checkpoint)
    await _put(writer, "first")  # starts a checkpoint, which hangs
    assert await asyncio.to_thread(started.wait, 5)
    try:
        async with asyncio.timeout(5):
            for i in range(5):
                await _put(writer, f"while-{i}")
        assert writer.checkpoints == 0  # still the one hanging; no second one started
    finally:
        release.set()
    await eventually(lambda: writer.checkpoints == 1, "a checkpoint")


async def test_a_failing_checkpoint_is_logged_once_and_the_commits_go_on(
    writer: SqliteWriter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    writer.checkpoint_interval_s = 0.0
    attempts = []

    def failing() -> None:
        attempts.append(1)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(writer, "_run_checkpoint", failing)
    with caplog.at_level(logging.WARNING, logger="persistence.sqlite_writer"):
        for i in range(4):
            await _put(writer, f"n{i}")
            await eventually(lambda: writer._checkpoint is None, "the checkpoint's end")
    assert len(attempts) == 4  # retried with each commit
    # this loop's records only (a session-scoped server's writer logs to the same logger)
    assert [r.getMessage() for r in caplog.records if r.thread == threading.get_ident()] == [
        "SQLite checkpoint failed (disk I/O error); retried after the next commits"
    ]
    assert writer.checkpoints == 0


async def test_under_steady_commits_the_wal_is_bounded_by_the_backstop_and_written_over(
    migrated_sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module docstring's claim: without a checkpoint that leaves nothing (none here: the
    checkpointer is held off), the WAL grows to the backstop's size, whose checkpoint inside a
    commit lets SQLite write the WAL from its start again; the file never grows past it."""
    from persistence import sqlite_writer

    backstop = 64  # pages
    monkeypatch.setattr(sqlite_writer, "_BACKSTOP_PAGES", backstop)
    path = _path(migrated_sqlite_url)
    writer = SqliteWriter(path, synchronous="FULL", busy_timeout_ms=5000)
    writer.checkpoint_interval_s = 3600.0
    wal = path.with_name(path.name + "-wal")
    probe = sqlite3.connect(path)
    page = probe.execute("PRAGMA page_size").fetchone()[0]
    probe.close()
    salts: set[bytes] = set()  # the WAL header's salts change each time the WAL starts again
    largest = 0
    try:
        for i in range(400):

            def work(conn: sqlite3.Connection, i: int = i) -> None:
                conn.execute(
                    "INSERT INTO server_secrets (name, value, created_at) VALUES (?, randomblob(3000), 0)",
                    (f"s{i}",),
                )

            await writer.transaction(work)
            largest = max(largest, wal.stat().st_size)
            salts.add(wal.read_bytes()[16:24])
    finally:
        await writer.close()
    assert writer.checkpoints == 0  # the backstop's doing, not the checkpointer's
    assert len(salts) >= 3  # started again more than once
    # the backstop's pages, the commit that crossed it, the WAL header
    assert largest <= (backstop + 8) * (page + 24) + 32

"""An acknowledged event survives the writer's death.

A subprocess appends through the real store and prints every acknowledgement; it is killed
with SIGKILL mid-stream (no clean shutdown: the commit queue, connections and any pending
batch die with it). The reopened store must hold every acknowledged event, in a contiguous log.
This is a process crash, not a power cut: with SQLite's synchronous=FULL (the default) a
power cut is covered by the fsync per commit, which a test cannot observe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from persistence.sql import open_store

_REPO = Path(__file__).resolve().parents[2]


async def test_acknowledged_events_survive_sigkill(sql_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.persistence.crash_writer",
        sql_url,
        "8",
        cwd=_REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(_REPO)},
    )
    assert process.stdout is not None and process.stderr is not None
    acknowledged: dict[str, int] = {}
    lines = 0
    try:
        async with asyncio.timeout(60):
            while lines < 400:
                line = await process.stdout.readline()
                if not line:
                    raise AssertionError((await process.stderr.read()).decode())
                rid, seq = line.decode().split()
                acknowledged[rid] = max(acknowledged.get(rid, -1), int(seq))
                lines += 1
    finally:
        process.send_signal(signal.SIGKILL)
        rest, _ = await process.communicate()
    for late in rest.decode().splitlines():  # acknowledged before the kill, read after it
        late_rid, late_seq = late.split()
        acknowledged[late_rid] = max(acknowledged.get(late_rid, -1), int(late_seq))
    assert process.returncode == -signal.SIGKILL
    assert len(acknowledged) == 8

    store = await open_store(sql_url)
    try:
        for rid, last in acknowledged.items():
            seqs = [event.seq for event in await store.load(rid)]
            assert seqs == list(range(len(seqs))), rid
            assert seqs[-1] >= last, (rid, last, seqs[-1])
            row = await store.get(rid)
            assert row is not None and row.last_seq == seqs[-1]
        assert set(acknowledged) <= set(await store.unfinished())
    finally:
        await store.close()

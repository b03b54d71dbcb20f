"""``python -m bench run --turns DIR`` and ``bench.turns``: a server's event-loop turns and group
commits, timed in the server, beside its deltas' latency."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from bench.turns import WINDOW_NS, load_dir, render
from tests.bench.commands import UNPINNED, python_m

_MS = 1_000_000


def test_the_slow_deltas_are_placed_in_the_windows_where_the_loop_was_busy(tmp_path):
    start = 10 * WINDOW_NS
    # four windows: the loop busy 10 %, 90 %, 50 %, 95 % of each (one turn a window)
    shares = [0.1, 0.9, 0.5, 0.95]
    turns = []
    for i, share in enumerate(shares):
        turns += [start + i * WINDOW_NS, int(WINDOW_NS * share), int(WINDOW_NS * share)]
    # 100 deltas a window: fast in the calm ones, slow in the busy ones
    latency = []
    for i, ms in enumerate([2.0, 30.0, 2.0, 40.0]):
        latency += [[start + i * WINDOW_NS + k * _MS, ms + k / 100] for k in range(100)]
    record = {
        "started_ns": start,
        "stopped_ns": start + len(shares) * WINDOW_NS,
        "turns": turns,
        "commits": [start, 5 * _MS, start + _MS, 20 * _MS, start + 2 * _MS, 6 * _MS],
        "commit_kinds": [{"_Append": 256}, {"_Append": 200, "_Create": 9}, {"_Append": 250}],
        "latency": latency,
    }
    # kept as the harness keeps it, printed as a developer prints it again
    (tmp_path / "ledger-c4-round0-rep0.json").write_text(json.dumps(record))
    [run] = load_dir(tmp_path)
    assert run.busy_by_window() == pytest.approx({0: 0.1, 1: 0.9, 2: 0.5, 3: 0.95})
    proc = python_m("bench.turns", str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    for table in (render([run]), proc.stdout):
        # 4 turns; busy 61 % of the load; commit p50 6 ms, max 20; the median commit 250 appends
        assert (
            "| ledger-c4-round0-rep0 | 4 | 61% | 90.00 / 95.00 / 95.0 | 3 | 6.0 / 20.0 / 20.0 | "
            "250 appends | 200 appends, 9 new |"
        ) in table
        # two busy windows of four; p50 2.5 ms in the calm ones, 40 in the busy; the slowest, busy
        assert "| ledger-c4-round0-rep0 | 2 of 4 | 2.5 / 40.0 | 41.0 | 100% |" in table


@pytest.mark.parametrize(
    ("module", "what"),
    [("bench.turns", "records"), ("bench.samples", "samples"), ("bench.cpu_split", "profiles")],
)
def test_a_directory_with_nothing_kept_prints_why_and_fails(tmp_path, module, what):
    proc = python_m(module, str(tmp_path), timeout=60)
    assert proc.returncode == 1
    assert f"no {what} in {tmp_path}" in proc.stderr


def test_the_wrapper_times_turns_and_commits_between_the_signals(tmp_path):
    """The wrapper as the harness runs it: a program that makes a group commit and commits
    through it; what it did before SIGUSR1 is not recorded; SIGUSR2 writes the record."""
    out = tmp_path / "record.json"
    program = textwrap.dedent(
        """
        import asyncio, json, os, signal, sys
        from persistence.group_commit import GroupCommit

        class Write:
            def __init__(self, loop):
                self.future = loop.create_future()

        class Other(Write):
            pass

        async def main():
            loop = asyncio.get_running_loop()
            print("uvloop" in sys.modules and sys.modules["uvloop"] is None, flush=True)

            async def flush(batch):
                await asyncio.sleep(0.002)
                for w in batch:
                    w.future.set_result(None)

            commits = GroupCommit(flush, window_s=0.0, max_batch=100)
            async def commit(*kinds):
                writes = [kind(loop) for kind in kinds]
                for w in writes:
                    commits.put(w)
                await asyncio.gather(*(w.future for w in writes))

            await commit(Write)  # before the signal: not recorded
            for kinds in ([Other], [Write, Write, Other]):  # two runs, one record each
                os.kill(os.getpid(), signal.SIGUSR1)
                await asyncio.sleep(0.01)
                await commit(*kinds)
                await commit(Other)
                os.kill(os.getpid(), signal.SIGUSR2)
                await asyncio.sleep(0.01)
                with open(sys.argv[1]) as f:
                    print(len(json.load(f)["commit_kinds"]), flush=True)
            await commits.close()

        asyncio.run(main())
        """
    )
    proc = python_m("bench.turns", str(out), "--", "-c", program, str(out), timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # uvicorn's auto loop would find no uvloop; each run's record holds its own two commits
    assert proc.stdout.split() == ["True", "2", "2"]
    record = json.loads(out.read_text())  # the second run's
    assert record["commit_kinds"] == [{"Write": 2, "Other": 1}, {"Other": 1}]
    starts, walls = record["commits"][0::2], record["commits"][1::2]
    assert all(w >= 2 * _MS for w in walls)  # each flush slept 2 ms
    assert record["started_ns"] <= starts[0] and starts[-1] <= record["stopped_ns"]
    turns = record["turns"]
    assert len(turns) >= 3 * 4 and len(turns) % 3 == 0
    for start, wall, busy in zip(turns[0::3], turns[1::3], turns[2::3], strict=True):
        assert record["started_ns"] <= start <= record["stopped_ns"]
        assert 0 <= busy <= wall


@pytest.mark.slow
def test_a_run_with_turns_keeps_each_servers_record_and_prints_the_tables(tmp_path):
    """The naive peer and the ledger, each timed through the harness as a developer runs it:
    the ledger's record holds its commits (the peer has none), both hold their turns and the
    deltas' latency, and the tables follow the usual one."""
    out = tmp_path / "turns"
    started = time.monotonic()
    proc = python_m(
        "bench", "run",
        "--turns", str(out),
        "--target", "naive", "--target", "ledger-sqlite",
        "--concurrency", "8", "--reps", "1", "--tokens", "50", "--token-delay-ms", "10",
        "--total-tokens", "2000", *UNPINNED,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {run.name: run for run in load_dir(out)}
    assert set(found) == {"naive-c8-round0-rep0", "ledger-sqlite-c8-round0-rep0"}
    ledger, peer = found["ledger-sqlite-c8-round0-rep0"], found["naive-c8-round0-rep0"]
    assert ledger.commits and not peer.commits
    assert any(kinds.get("_Create") for kinds in ledger.kinds)
    for run in (ledger, peer):
        assert run.turns and run.samples
        assert (
            run.started_ns
            < run.stopped_ns
            < run.started_ns + int((time.monotonic() - started) * 1e9)
        )
        # 40 streams of 50 deltas, every one sampled, each yielded while the record was on
        assert len(run.samples) == 2000
        assert all(run.started_ns <= y <= run.stopped_ns for y, _ in run.samples)
    assert render(list(found.values())).splitlines()[0] in proc.stdout
    assert "| ledger-sqlite-c8-round0-rep0 |" in proc.stdout

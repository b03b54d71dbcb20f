"""The whole benchmark, end to end, on tiny parameters (no performance assertion)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.commands import UNPINNED, run
from tests.support.process import without_modules


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` run from the repository's root as a user would; it must exit 0."""
    proc = run(argv, env=env)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def _bench_run(tmp_path: Path, *args: str) -> tuple[dict, str]:
    """``python -m bench run`` with ``args``, unpinned, writing its JSON and its report into
    ``tmp_path``: the JSON, and the report's text."""
    out = tmp_path / "bench.json"
    results = tmp_path / "RESULTS.md"
    _run(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            *args,
            *UNPINNED,
            "--json",
            str(out),
            "--write-results",
            str(results),
        ],
    )
    return json.loads(out.read_text()), results.read_text()


@pytest.mark.slow
def test_run_naive_targets_end_to_end(tmp_path):
    report, text = _bench_run(
        tmp_path,
        *("--target", "naive", "--target", "naive-c16", "--target", "naive-raw"),
        *("--concurrency", "1,3", "--reps", "1", "--tokens", "20", "--total-tokens", "100"),
    )
    cells = {(s["target"], s["concurrency"]): s for s in report["summaries"]}
    assert set(cells) == {(t, c) for t in ("naive", "naive-c16", "naive-raw") for c in (1, 3)}
    for s in cells.values():
        assert s["failure"] is None and s["errors"] == 0
        assert s["tokens_per_s"] > 0
        assert s["latency_p50_ms"] is not None
        assert s["server_cpu_us_per_token"] is not None
        assert 0 <= s["server_sys_us_per_token"] <= s["server_cpu_us_per_token"]
        assert s["server_written_bytes_per_token"] > 0  # (its token-times file: a few bytes)
    runs = {(r["target"], r["concurrency"]): r for r in report["runs"]}
    # 100 tokens at 20 per stream: 5 streams for C=1; ceil(100 / 60) = 2 per worker for C=3.
    assert runs[("naive", 1)]["streams"] == 5 and runs[("naive", 1)]["tokens"] == 100
    assert runs[("naive", 3)]["streams"] == 6 and runs[("naive", 3)]["tokens"] == 120
    assert cells[("naive", 3)]["ratio_to_naive"] == 1.0
    assert "| naive-c16 | 3 |" in text and "Command: `python -m bench run" in text


@pytest.mark.slow
def test_run_open_loop_end_to_end(tmp_path):
    """``bench run --open-loop``: the load generator gets the arrival rate (C a stream's paced
    duration), every stream is read whole, the run records how many started late, and the
    report says the loop was open."""
    report, text = _bench_run(
        tmp_path,
        *("--target", "naive", "--concurrency", "4", "--reps", "1", "--tokens", "10"),
        *("--token-delay-ms", "10", "--total-tokens", "200", "--open-loop", "--no-warmup"),
    )
    (run_,) = report["runs"]
    # 200 tokens at 10 a stream: 5 a worker, 20 arrivals at 4 / 0.1 s = 40 a second
    assert run_["streams"] == 20 and run_["errors"] == 0 and run_["tokens"] == 200
    assert isinstance(run_["late_arrivals"], int)
    assert run_["latency_p50_ms"] is not None and run_["ttft_p50_ms"] is not None
    assert 0.4 < run_["wall_s"] < 5
    assert "open loop: Poisson arrivals" in text


@pytest.mark.slow
@pytest.mark.postgres
def test_frontends_end_to_end_keeps_the_callers_pythonpath(tmp_path):
    """``bench.frontends`` serves and measures one frontend, and its server and load generator
    see the caller's ``PYTHONPATH`` (where ``bench/gpu/lent_machine.sh`` installs the packages)
    after the repository: a ``sitecustomize`` there records every process that starts."""
    site = tmp_path / "site"
    site.mkdir()
    seen = tmp_path / "seen"
    seen.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "mark = os.environ.get('BENCH_TEST_SEEN')\n"
        "if mark:\n"
        "    with open('/proc/self/cmdline', 'rb') as cmd:\n"
        "        argv = cmd.read().decode().split('\\0')\n"
        "    with open(os.path.join(mark, str(os.getpid())), 'w') as f:\n"
        "        f.write(' '.join(argv))\n"
    )
    out = tmp_path / "frontends.json"
    env = {**os.environ, "PYTHONPATH": str(site), "BENCH_TEST_SEEN": str(seen)}
    argv = [
        sys.executable, "-m", "bench.frontends", "--frontends", "1",
        "--streams-per-frontend", "4", "--tokens", "20", "--token-delay-ms", "1",
        "--total-tokens", "160", "--max-run-seconds", "20", "--json", str(out),
    ]  # fmt: skip
    _run(argv, env)
    (row,) = json.loads(out.read_text())
    assert row["frontends"] == 1 and row["errors"] == 0
    assert row["tokens"] == 160 and row["tokens_per_s"] > 0  # 4 workers x 2 streams x 20
    assert row["runs_tokens_per_s"] == [row["tokens_per_s"]]
    assert row["commits"] > 0 and 0 <= row["slow_commits"] <= row["commits"]
    assert row["db_cpu_us_per_token"] > 0  # the run's database had backends that worked
    argvs = [path.read_text() for path in seen.iterdir()]
    assert any("serve" in argv.split() for argv in argvs), argvs  # the server
    assert any("bench.loadgen" in argv.split() for argv in argvs), argvs  # the load generator


def test_frontends_shows_the_median_run_and_of_two_the_slower():
    from bench.frontends import _median_run

    runs = [{"tokens_per_s": 9.0, "n": 1}, {"tokens_per_s": 7.0, "n": 2}]
    assert _median_run(runs) == {"tokens_per_s": 7.0, "n": 2, "runs_tokens_per_s": [9.0, 7.0]}
    three = [*runs, {"tokens_per_s": 8.0, "n": 3}]
    assert _median_run(three)["n"] == 3


@pytest.mark.slow
@pytest.mark.postgres
def test_lent_machine_script_records_the_machine_and_finds_postgres(tmp_path):
    """``bench/gpu/lent_machine.sh`` as an operator starts it, here with no stage to run: with
    no wheels folder it uses the caller's Python and packages, and PostgreSQL already listens on
    5432, so it starts none; what it records of the machine comes back in ``machine.txt``."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "STAGES": "none",
        "PYTHON": sys.executable,
        "WHEELS": str(tmp_path / "no-wheels"),
    }
    proc = _run(["bash", "bench/gpu/lent_machine.sh"], env)
    machine = (out / "machine.txt").read_text()
    assert f"cores: {os.cpu_count()}" in machine
    assert "fdatasync of 20 KB appends on /tmp:" in machine and "over 100 ms:" in machine
    assert "uvloop:" in machine
    assert "postgres 1" in proc.stdout and "synchronous_commit on" in proc.stdout
    assert proc.stdout.rstrip().endswith("done")


@pytest.mark.slow
def test_run_with_a_history_serves_over_a_database_that_holds_it(tmp_path):
    """``--history N``: the ledger's server starts on a database that already holds N finished
    responses (and measures as usual); the run's own responses come on top."""
    proc = _run(
        [
            sys.executable, "-m", "bench", "run", "--target", "ledger-sqlite", "--history", "500",
            "--concurrency", "2", "--reps", "1", "--tokens", "20", "--total-tokens", "100",
            "--no-warmup", *UNPINNED,
            "--keep-workdirs", "--json", str(tmp_path / "bench.json"),
        ],
    )  # fmt: skip
    assert "500 stored responses in" in proc.stderr
    assert "not both installed" not in proc.stderr  # (its server ran on uvloop and httptools)
    # SQLite writes whole pages (4 KB) to its WAL, several a commit: far more than a token's text
    (summary,) = json.loads((tmp_path / "bench.json").read_text())["summaries"]
    assert summary["server_written_bytes_per_token"] > 200
    (kept,) = [
        line.split("kept ", 1)[1].strip() for line in proc.stderr.splitlines() if "kept " in line
    ]
    try:
        connection = sqlite3.connect(f"{kept}/ledger.db")
        try:
            statuses = dict(
                connection.execute("SELECT status, count(*) FROM responses GROUP BY status")
            )
        finally:
            connection.close()
    finally:
        shutil.rmtree(kept)
    assert statuses["completed"] >= 500 + 5 and set(statuses) == {"completed"}


def test_run_says_when_a_ledger_server_ran_without_uvloop(tmp_path):
    """A ledger server that found uvloop missing warns at start (``app.transport``), and the run
    repeats it under the server's command, so a figure measured on asyncio's loop says so."""
    proc = _run(
        [
            sys.executable, "-m", "bench", "run", "--target", "ledger-sqlite",
            "--concurrency", "2", "--reps", "1", "--tokens", "20", "--total-tokens", "40",
            "--no-warmup", *UNPINNED, "--json", str(tmp_path / "bench.json"),
        ],
        env={**os.environ, **without_modules(tmp_path, "uvloop")},
    )  # fmt: skip
    assert (
        "\n  event loop: asyncio; HTTP parser: httptools (uvloop and httptools are not both "
        "installed" in proc.stderr
    ), proc.stderr[-3000:]

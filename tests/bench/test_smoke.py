"""The whole benchmark, end to end, on tiny parameters (no performance assertion)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.targets import REPO_ROOT


@pytest.mark.slow
def test_run_naive_targets_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    results = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            "--target",
            "naive",
            "--target",
            "naive-c16",
            "--target",
            "naive-raw",
            "--concurrency",
            "1,3",
            "--reps",
            "1",
            "--tokens",
            "20",
            "--total-tokens",
            "100",
            "--quiet-timeout",
            "0",
            "--server-cpus",
            "none",
            "--loadgen-cpus",
            "none",
            "--json",
            str(out),
            "--write-results",
            str(results),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cells = {(s["target"], s["concurrency"]): s for s in report["summaries"]}
    assert set(cells) == {(t, c) for t in ("naive", "naive-c16", "naive-raw") for c in (1, 3)}
    for s in cells.values():
        assert s["failure"] is None and s["errors"] == 0
        assert s["tokens_per_s"] > 0
        assert s["latency_p50_ms"] is not None
        assert s["server_cpu_us_per_token"] is not None
        assert 0 <= s["server_sys_us_per_token"] <= s["server_cpu_us_per_token"]
    runs = {(r["target"], r["concurrency"]): r for r in report["runs"]}
    # 100 tokens at 20 per stream: 5 streams for C=1; ceil(100 / 60) = 2 per worker for C=3.
    assert runs[("naive", 1)]["streams"] == 5 and runs[("naive", 1)]["tokens"] == 100
    assert runs[("naive", 3)]["streams"] == 6 and runs[("naive", 3)]["tokens"] == 120
    assert cells[("naive", 3)]["ratio_to_naive"] == 1.0
    text = results.read_text()
    assert "| naive-c16 | 3 |" in text and "Command: `python -m bench run" in text

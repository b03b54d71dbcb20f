"""``bench/faults.py`` end to end on its smallest run (one fault, two streams): it prints the
figures table (no assertion on the figures themselves: that is the fault tests' job)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_fault_benchmark_prints_its_figures() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--streams", "2", "--only", "sqlite-poisoned"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    header, _rule, row = proc.stdout.splitlines()[:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:6] == ["fault", "streams", "acked", "lost", "non_terminal", "silent"]
    cells = dict(zip(columns, (c.strip() for c in row.strip("|").split("|")), strict=True))
    assert cells["fault"] == "sqlite-poisoned" and cells["streams"] == "2"
    assert int(cells["acked"]) > 0 and cells["lost"].isdigit() and cells["silent"].isdigit()

    bad = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--only", "no-such-fault"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "unknown faults: no-such-fault" in bad.stderr

"""bench.key_check runs and prints its figures (tiny parameters, no performance assertion)."""

from __future__ import annotations

import subprocess
import sys


def test_key_check_benchmark_prints_its_figures() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.key_check",
            "--requests",
            "200",
            "--reps",
            "1",
            "--uncached-requests",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "middleware: what the key adds" in proc.stdout and "uncached" in proc.stdout

"""``BENCH_POSTGRES_PORT`` points the PostgreSQL target at another cluster (one on a RAM disk):
``python -m bench targets`` then checks that port, and only that one."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.targets import REPO_ROOT


def _postgres_line(port: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "BENCH_POSTGRES_PORT"}
    if port is not None:
        env["BENCH_POSTGRES_PORT"] = port
    out = subprocess.run(
        [sys.executable, "-m", "bench", "targets"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return next(line for line in out.splitlines() if line.startswith("ledger-postgres"))


def test_the_postgres_target_uses_the_port_it_is_given():
    assert "unavailable: no PostgreSQL on 127.0.0.1:1:" in _postgres_line("1")
    # unset: the shared cluster on 5432 (up on every developer machine and in CI)
    assert _postgres_line(None).split()[1] == "ok"

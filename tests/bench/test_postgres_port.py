"""``BENCH_POSTGRES_PORT`` points the PostgreSQL target at another cluster (one on a RAM disk):
``python -m bench targets`` then checks that port, and only that one; ``BENCH_POSTGRES_SOCKET``
reaches it over its Unix socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.targets import REPO_ROOT
from tests.bench.commands import UNPINNED
from tests.support.pg_cluster import own_cluster

#: The variables these tests set (any the caller's environment has are left out).
_OURS = ("BENCH_POSTGRES_PORT", "BENCH_POSTGRES_SOCKET")


def _with(env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGV`` with ``env`` on top of the caller's environment, less ``_OURS``."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        cwd=REPO_ROOT,
        env={**{k: v for k, v in os.environ.items() if k not in _OURS}, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _postgres_line(env: dict[str, str]) -> str:
    """``python -m bench targets``' line for the PostgreSQL target."""
    proc = _with(env, ["targets"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return next(line for line in proc.stdout.splitlines() if line.startswith("ledger-postgres"))


def test_the_postgres_target_uses_the_port_it_is_given():
    assert "unavailable: no PostgreSQL on 127.0.0.1:1:" in _postgres_line(
        {"BENCH_POSTGRES_PORT": "1"}
    )
    # unset: the shared cluster on 5432 (up on every developer machine and in CI)
    assert _postgres_line({}).split()[1] == "ok"


def test_the_postgres_target_over_a_unix_socket(tmp_path):
    """``BENCH_POSTGRES_SOCKET``: the target checks that socket, and a run reaches the cluster
    through it (the server's ``--database-url`` names the socket's directory)."""
    missing = _postgres_line({"BENCH_POSTGRES_SOCKET": "/nonexistent"})
    assert "unavailable: no PostgreSQL socket at /nonexistent/.s.PGSQL.5432" in missing
    with own_cluster() as cluster:
        env = {"BENCH_POSTGRES_SOCKET": str(cluster.root), "BENCH_POSTGRES_PORT": str(cluster.port)}
        line = _postgres_line(env)
        assert line.split()[1] == "ok", line
        out = tmp_path / "bench.json"
        proc = _with(
            env,
            [
                "run", "--target", "ledger-postgres", "--concurrency", "2", "--reps", "1",
                "--tokens", "20", "--total-tokens", "40", "--no-warmup", *UNPINNED,
                "--json", str(out),
            ],
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"?host={cluster.root}&port={cluster.port}" in proc.stderr
        (summary,) = json.loads(out.read_text())["summaries"]
        assert summary["failure"] is None and summary["errors"] == 0, summary
        assert summary["db_cpu_us_per_token"] is not None  # its backends found over the socket

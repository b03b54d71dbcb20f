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


def _postgres_line(port: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _OURS}
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


def _with(env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        cwd=REPO_ROOT,
        env={**{k: v for k, v in os.environ.items() if k not in _OURS}, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_postgres_target_over_a_unix_socket(tmp_path):
    """``BENCH_POSTGRES_SOCKET``: the target checks that socket, and a run reaches the cluster
    through it (the server's ``--database-url`` names the socket's directory)."""
    missing = _with({"BENCH_POSTGRES_SOCKET": "/nonexistent"}, ["targets"]).stdout
    assert "unavailable: no PostgreSQL socket at /nonexistent/.s.PGSQL.5432" in missing
    with own_cluster() as cluster:
        env = {"BENCH_POSTGRES_SOCKET": str(cluster.root), "BENCH_POSTGRES_PORT": str(cluster.port)}
        listed = _with(env, ["targets"]).stdout
        line = next(x for x in listed.splitlines() if x.startswith("ledger-postgres"))
        assert line.split()[1] == "ok", listed
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

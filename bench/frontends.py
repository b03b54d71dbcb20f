"""Paced capacity of ``serve --frontends N`` (issue 20's target: N frontends on N cores scale at
least 0.8 x N).

    python -m bench.frontends --frontends 1,2                     # this 2-core machine
    python -m bench.frontends --frontends 1,2,4,8 --loadgens 4    # a 16-core machine

For each N: a fresh PostgreSQL database, ``responses-ledger serve --frontends N`` with the
scripted engine paced like a real engine's step loop (``--token-delay-ms``: every stream one
token per step), pinned to N cores of its own (``--server-cpus``, default the first N), and
``--loadgens`` load generators (``bench.loadgen``, one process each, the streams shared between
them) pinned to the cores after those. The offered load grows with N (``--streams-per-frontend``
x N streams), so what is measured is how many paced tokens per second N frontends deliver when
offered more than one can. Printed per N: delivered tokens/s (the median run's, the slower of
two; every run's beside it), its ratio to N = 1 (the target: ≥ 0.8 N), the time to first
token, the server's CPU (parent and frontends) per token, PostgreSQL's (the backends serving the
run's database) per token, the commits over 100 ms of all (each frontend's ``/metrics``, summed:
the shared database, not the frontends, is what N frontends wait on when these grow), and the
load generators' CPU use (near 1.0 per process: the load generators, not the server, were the
limit, so add ``--loadgens``).

On a machine with fewer cores than N frontends plus load generators the processes share cores
and the figures say so (``cores`` column: what was pinned, ``shared`` when it was not possible).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    SLOW_COMMIT_S,
    _delta_s,
    _PostgresDatabase,
    _tree_cpu_s,
    commit_counts,
)
from bench.targets import LEDGER_MODEL, LEDGER_WORD, ledger_body, ledger_script

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
HEADER = "x-responses-ledger-replica"

__all__ = ["main"]


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _pinned(cpus: list[int] | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus)), *argv] if cpus else argv


def _every_frontend(
    port: int,
    count: int,
    path: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
) -> dict[str, httpx.Response]:
    """``GET path``'s 200 answer from each of the ``count`` frontends, by replica id: a new
    connection reaches whichever frontend the kernel gives it to, so this asks until every one
    has answered once (and, with ``proc``, fails if that server exits meanwhile)."""
    answers: dict[str, httpx.Response] = {}
    deadline = time.monotonic() + timeout_s
    while len(answers) < count:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{path}: {len(answers)} of {count} frontends answered in {timeout_s} s"
            )
        try:
            with httpx.Client(timeout=30) as client:
                answer = client.get(f"http://{HOST}:{port}{path}")
        except httpx.TransportError:  # (not listening yet)
            time.sleep(0.1)
            continue
        if answer.status_code == 200:
            answers.setdefault(answer.headers.get(HEADER, "single"), answer)
        else:
            time.sleep(0.1)
    return answers


def _commits(port: int, count: int) -> tuple[int, int]:
    """(commits over ``SLOW_COMMIT_S``, all commits), summed over the frontends: each counts its
    own in its ``/metrics``."""
    slow = every = 0
    for answer in _every_frontend(port, count, "/metrics", 60.0).values():
        counts = commit_counts(answer.text)
        if counts is None:
            raise RuntimeError("/metrics has no commit latency histogram")
        slow, every = slow + counts[0], every + counts[1]
    return slow, every


def _run_one(args: argparse.Namespace, count: int, cores: int, workdir: Path) -> dict[str, Any]:
    database = _PostgresDatabase()  # a fresh database a run, as ``bench run``'s
    database.create()
    url = database.url
    script = ledger_script(workdir, args.tokens, args.token_delay_ms)["script"]
    port = _free_port()
    server_cpus = list(range(count))
    loadgen_cpus = list(range(count, count + args.loadgens))
    pinned = count + args.loadgens <= cores
    argv = [
        sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
        "serve", "--engine", "scripted", "--script", script, "--database-url", url,
        "--host", HOST, "--port", str(port), "--frontends", str(count),
    ]  # fmt: skip
    # the repository first, then what the caller's PYTHONPATH holds (packages installed with
    # --target on a machine without a virtual environment: bench/gpu/lent_machine.sh)
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "RESPONSES_LEDGER_LOG_LEVEL": "warning", "PYTHONPATH": pythonpath}
    log = (workdir / f"server-{count}.log").open("wb")
    server = subprocess.Popen(
        _pinned(server_cpus if pinned else None, argv),
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        _every_frontend(port, count, "/health", args.startup_timeout, server)
        streams = args.streams_per_frontend * count
        per_loadgen = [
            streams // args.loadgens + (i < streams % args.loadgens) for i in range(args.loadgens)
        ]
        per_worker = max(1, -(-args.total_tokens * count // (streams * args.tokens)))
        body = json.dumps(ledger_body(args.tokens))
        commits0 = _commits(port, count)
        db0 = database.backend_cpu()
        cpu0 = _tree_cpu_s(server.pid)
        loadgens = []
        for i, concurrency in enumerate(per_loadgen):
            out = workdir / f"loadgen-{count}-{i}.json"
            lg_argv = [
                sys.executable, "-m", "bench.loadgen", "--url", f"http://{HOST}:{port}/v1/responses",
                "--concurrency", str(concurrency), "--streams-per-worker", str(per_worker),
                "--body", body, "--max-seconds", str(args.max_run_seconds), "--out", str(out),
                # a delta carries every token that waited for a commit: count the words
                "--token-marker", LEDGER_WORD, "--expected-tokens", str(args.tokens),
            ]  # fmt: skip
            cpus = [loadgen_cpus[i]] if pinned else None
            loadgens.append((subprocess.Popen(_pinned(cpus, lg_argv), cwd=REPO_ROOT, env=env), out))
        reports = []
        for proc, out in loadgens:
            if proc.wait() != 0:
                raise RuntimeError(f"a load generator failed ({proc.returncode})")
            reports.append(json.loads(out.read_text()))
        server_cpu_s = _delta_s(cpu0, _tree_cpu_s(server.pid))
        db_cpu_s = _delta_s(db0, database.backend_cpu())
        commits1 = _commits(port, count)
    finally:
        server.terminate()
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        database.drop()
    t0 = min(r["t0_ns"] for r in reports)
    t1 = max(r["t1_ns"] for r in reports)
    tokens = sum(r["tokens"] for r in reports)
    wall_s = (t1 - t0) / 1e9
    ttft = sorted(r["ttft_ms"].get("p50") for r in reports if r.get("ttft_ms"))
    return {
        "frontends": count,
        "streams": sum(per_loadgen),
        "errors": sum(r["error_count"] for r in reports),
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s else 0.0,
        "ttft_p50_ms": ttft[len(ttft) // 2] if ttft else None,
        "server_cpu_us_per_token": server_cpu_s * 1e6 / tokens if tokens else None,
        "db_cpu_us_per_token": db_cpu_s * 1e6 / tokens if tokens else None,
        "slow_commits": commits1[0] - commits0[0],
        "commits": commits1[1] - commits0[1],
        "loadgen_cpu_util": max(r["loadgen_cpu_util"] for r in reports),
        "cores": f"server {server_cpus}, loadgens {loadgen_cpus}" if pinned else "shared",
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median tokens/s, the lower of the two middle ones when there are two (never
    the better of two), with every run's tokens/s under ``runs_tokens_per_s``."""
    ordered = sorted(runs, key=lambda r: r["tokens_per_s"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "runs_tokens_per_s": [r["tokens_per_s"] for r in runs],
    }


def _table(rows: list[dict[str, Any]]) -> str:
    base = next((r["tokens_per_s"] for r in rows if r["frontends"] == 1), None)
    lines = [
        "| frontends | streams | tokens/s | every run | x N=1 (target >= 0.8 N) | TTFT p50 ms "
        "| server µs/token | DB µs/token | slow commits | loadgen CPU (max) | errors | cores |",
        "|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base:.2f}" if base else "-"
        ttft = f"{r['ttft_p50_ms']:.1f}" if r["ttft_p50_ms"] is not None else "-"
        cpu = f"{r['server_cpu_us_per_token']:.0f}" if r["server_cpu_us_per_token"] else "-"
        db = f"{r['db_cpu_us_per_token']:.1f}" if r["db_cpu_us_per_token"] is not None else "-"
        every = ", ".join(f"{t:,.0f}" for t in r["runs_tokens_per_s"])
        lines.append(
            f"| {r['frontends']} | {r['streams']} | {r['tokens_per_s']:,.0f} | {every} | {ratio} | "
            f"{ttft} | {cpu} | {db} | {r['slow_commits']:,} of {r['commits']:,} | "
            f"{r['loadgen_cpu_util']:.2f} | {r['errors']} | {r['cores']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.frontends", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--frontends", type=_ints, default=[1, 2], help="comma-separated N (default 1,2)"
    )
    parser.add_argument("--streams-per-frontend", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per stream")
    parser.add_argument("--token-delay-ms", type=float, default=10.0)
    parser.add_argument(
        "--total-tokens", type=int, default=400_000, help="per run and per frontend"
    )
    parser.add_argument("--max-run-seconds", type=float, default=20.0)
    parser.add_argument("--loadgens", type=int, default=1, help="load generator processes")
    parser.add_argument("--reps", type=int, default=1, help="runs per N (the median is shown)")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-frontends-") as tmp:
        for count in args.frontends:
            runs = []
            for rep in range(args.reps):
                print(
                    f"frontends {count}, run {rep + 1} of {args.reps}", file=sys.stderr, flush=True
                )
                workdir = Path(tmp) / f"n{count}-{rep}"
                workdir.mkdir()
                runs.append(_run_one(args, count, cores, workdir))
            rows.append(_median_run(runs))
    print(
        f"paced: {args.tokens} tokens a stream, one per {args.token_delay_ms:g} ms step, "
        f"{args.streams_per_frontend} streams per frontend, model {LEDGER_MODEL}, "
        f"{cores} cores, {args.loadgens} load generator(s)"
    )
    print(_table(rows))
    print(
        f"every run: each run's tokens/s, the row shows the median one (of two, the slower); "
        f"DB: PostgreSQL's backends for the run's database; slow commits: over "
        f"{float(SLOW_COMMIT_S) * 1000:.0f} ms, of all, summed over the frontends' /metrics"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

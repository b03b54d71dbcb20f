"""Store faults under load: the issue 14 figures, per fault.

``python -m bench.faults [--streams 64] [--only pg-stop,sqlite-full] [--verbose]``

Runs each fault scenario of ``tests/faults/`` once, with more streams than the tests (default
64), each against a real ``responses-ledger serve`` process on loopback: PostgreSQL (a cluster
of its own in a temporary directory, never the shared one) restarted with a retry time longer
and shorter than the outage, stopped, and frozen (SIGSTOP); SQLite on a tiny tmpfs filled up,
SQLite with its write lock held by another process; the poisoned request (lone surrogates)
among the live streams on both databases; and the degraded start on a read-only and on a full
SQLite database. It prints, per fault:

- **acked**: events clients received (the stored logs, read back after the fault);
- **lost**: acknowledged events not in the log with the same seq, type and payload;
- **non-terminal**: responses not terminal 30 s after the fault ended;
- **silent**: streams that ended without a terminal or ``error`` event;
- **endings**: how the streams ended; **streams ended**: seconds from the fault's start until
  the last stream ended (``stalled``: not within the scenario's bound, e.g. statement timeout +
  retry time + 10 s for a frozen PostgreSQL); **terminal after**: seconds from the fault's end
  until every response was terminal; **contract**: whether the run met everything the fault
  tests assert (``tests/faults/expectations.py``), and if not, the assertion that failed first.

Targets (issue 14): 0 lost, 0 non-terminal, 0 silent, for every fault. Every scenario is
bounded (its waits time out); a whole run takes a few minutes. Needs root (runuser for
PostgreSQL, mount for the tmpfs); rows that cannot run here say why.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.faults import expectations, scenarios
from tests.faults.storage import Tmpfs, mount_unavailable
from tests.support.pg_cluster import PgCluster
from tests.support.pg_cluster import unavailable as pg_unavailable

NAMES = (
    "pg-restart-long-retry",
    "pg-restart-short-retry",
    "pg-stop",
    "pg-freeze",
    "pg-poisoned",
    "sqlite-full",
    "sqlite-lock",
    "sqlite-poisoned",
    "sqlite-degraded-readonly",
    "sqlite-degraded-full",
)


def _first_failure(check: Callable[[], None]) -> str:
    """``yes``, or ``no`` and the assertion that failed first (its source line)."""
    try:
        check()
    except AssertionError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        line = (frames[-1].line or "").strip() if frames else ""
        return f"no: `{line.removesuffix(', context')[:90]}`"
    return "yes"


def _row(name: str, run: Any, check: Callable[[], None]) -> dict[str, Any]:
    row: dict[str, Any] = {"fault": name, "contract": _first_failure(check)}
    figures = getattr(run, "figures", None)
    if figures is not None:
        row.update(
            streams=figures.streams,
            acked=figures.acknowledged,
            lost=len(figures.lost),
            non_terminal=len(figures.non_terminal),
            silent=len(figures.silent),
            endings=",".join(f"{k}:{v}" for k, v in sorted(figures.endings.items())),
            terminal_after=(
                "-" if figures.terminal_after_s is None else f"{figures.terminal_after_s:.1f}"
            ),
        )
        if hasattr(run, "streams_ended_s"):  # an outage: did the streams end while it lasted?
            ended = run.streams_ended_s
            row["streams_ended"] = "stalled" if ended is None else f"{ended:.1f}"
    else:  # a degraded start: no streams, what it did instead
        closed = getattr(run, "closed_after_s", None)
        row.update(
            endings=f"started={run.started}",
            terminal_after="-" if closed is None else f"{closed:.1f}",
        )
    return row


def _run(
    name: str, streams: int, workdir: Path, cluster: PgCluster | None
) -> tuple[dict[str, Any], str]:
    def disk() -> Tmpfs:
        return Tmpfs("64m" if streams > 16 else "16m")

    run: Any
    check: Callable[[], None]
    if name.startswith("pg-"):
        assert cluster is not None
        if name == "pg-restart-long-retry":
            run = scenarios.pg_restart(cluster, workdir, streams=streams, retry_s=20, downtime_s=2)
            check = lambda: expectations.targets(run.figures, run.summary())  # noqa: E731
        elif name == "pg-restart-short-retry":
            run = scenarios.pg_restart(cluster, workdir, streams=streams, retry_s=1, downtime_s=5)
            check = lambda: expectations.targets(run.figures, run.summary())  # noqa: E731
        elif name == "pg-stop":
            run = scenarios.pg_stop(cluster, workdir, streams=streams)
            check = lambda: expectations.outage(run)  # noqa: E731
        elif name == "pg-freeze":
            run = scenarios.pg_freeze(cluster, workdir, streams=streams)
            check = lambda: expectations.outage(run)  # noqa: E731
        else:
            cluster.reset_database()
            run = scenarios.poisoned(workdir, cluster.url, streams=streams)
            check = lambda: expectations.poisoned(run)  # noqa: E731
    elif name == "sqlite-full":
        with disk() as tmpfs:
            run = scenarios.sqlite_full(tmpfs, workdir, streams=streams)
        check = lambda: expectations.outage(run, posts=16)  # noqa: E731
    elif name == "sqlite-lock":
        run = scenarios.sqlite_lock(workdir, streams=streams)
        check = lambda: expectations.outage(run)  # noqa: E731
    elif name == "sqlite-poisoned":
        run = scenarios.poisoned(
            workdir, f"sqlite+aiosqlite:///{workdir / 'poisoned.db'}", streams=streams
        )
        check = lambda: expectations.poisoned(run)  # noqa: E731
    else:
        mode = name.rsplit("-", 1)[1]
        with disk() as tmpfs:
            run = scenarios.degraded_start(tmpfs, workdir, mode)
        check = lambda: expectations.degraded(run)  # noqa: E731
    return _row(name, run, check), run.summary()


COLUMNS = (
    "fault",
    "streams",
    "acked",
    "lost",
    "non_terminal",
    "silent",
    "endings",
    "streams_ended",
    "terminal_after",
    "contract",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--streams", type=int, default=64, help="live streams per fault (default 64)"
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(NAMES)}")
    parser.add_argument("--verbose", action="store_true", help="print each run's full summary")
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(NAMES)
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")

    skipped: dict[str, str] = {}
    pg_reason = pg_unavailable()
    mount_reason = mount_unavailable()
    for name in chosen:
        if name.startswith("pg-") and pg_reason:
            skipped[name] = pg_reason
        if (
            name in ("sqlite-full", "sqlite-degraded-readonly", "sqlite-degraded-full")
            and mount_reason
        ):
            skipped[name] = mount_reason

    cluster = None
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        if any(n.startswith("pg-") and n not in skipped for n in chosen):
            cluster = PgCluster.create(max_connections=200)
        for name in chosen:
            if name in skipped:
                rows.append({"fault": name, "contract": f"skipped: {skipped[name]}"})
                continue
            with tempfile.TemporaryDirectory(prefix=f"bench-faults-{name}-") as tmp:
                t0 = time.monotonic()
                try:
                    row, summary = _run(name, args.streams, Path(tmp), cluster)
                except Exception as exc:  # the scenario itself broke: report it, go on
                    row, summary = (
                        {"fault": name, "contract": f"error: {type(exc).__name__}: {exc}"[:120]},
                        "",
                    )
                row["seconds"] = f"{time.monotonic() - t0:.0f}"
                rows.append(row)
                print(f"{name}: done in {row['seconds']} s", file=sys.stderr, flush=True)
                if args.verbose and summary:
                    print(summary, file=sys.stderr, flush=True)
    finally:
        if cluster is not None:
            cluster.destroy()

    columns = (*COLUMNS, "seconds")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "-")) for c in columns) + " |")
    print(
        f"\n{len(rows)} faults in {time.monotonic() - started:.0f} s; targets: lost, "
        "non_terminal and silent 0 for every fault"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

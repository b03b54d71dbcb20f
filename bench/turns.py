"""Where a paced stream's slow deltas come from: the event loop's turns and the group commits,
timed inside the server, beside the deltas' latency over the run.

Usage: ``python -m bench run --turns DIR ...`` runs every measured server under this module's
wrapper (``python -m bench.turns OUT -- (-m MODULE | -c CODE) ARGS...``, what ``bench.profiled``
does for cProfile), keeps each run's record in DIR (``<target>-c<C>-round<R>-rep<K>.json``) with
the load generator's latency samples (20,000 of them), and prints this module's tables after its
own; ``python -m bench.turns DIR`` prints them again from the files.

What the wrapper records, from ``SIGUSR1`` to ``SIGUSR2`` (the harness sends them around the
load, so start-up and warm-up are left out; ``SIGUSR2`` writes OUT, whole, then renamed):

- every turn of the event loop (``BaseEventLoop._run_once``): when it began, its wall time, and
  the time its callbacks ran (its *busy* time; the rest of a turn is the wait for I/O);
- every group commit (``persistence.group_commit.GroupCommit``'s flush): when it began, its
  wall time, and what its batch held (writes by kind: a new response's row, appends, audits).

The tables: the turns' busy time (p50, p90, max: a long turn delays every stream at once), the
loop's busy share over the load; the commits' wall time and what the slowest tenth carried
against the median commit; then the run cut in 100 ms windows by how busy the loop was in them,
and where the deltas' latency falls: its p50 in calm and in busy windows, and what share of the
slowest 1% of deltas were yielded in busy windows. Each delta's yield time is the engine's clock
(``bench.token_times``), the same monotonic clock the wrapper reads.

The wrapper runs the server on asyncio's own event loop: a turn cannot be timed inside uvloop
(uvicorn's choice when it is installed; the wrapper makes it unimportable). At 256 paced streams
the wrapped servers spent about what plain ones did the same hour (twenty-third session:
PostgreSQL 26.2 µs of server CPU a token against 25.0-27.5, SQLite 36.1 against 35.6-36.7).
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.events
import json
import sys
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.kept import show_dir
from bench.profiled import run_wrapped
from bench.stats import percentile, percentiles

__all__ = ["Record", "install", "load_dir", "main", "render"]

#: The windows the run is cut in (ns), and how busy a window's loop must be to count as busy.
WINDOW_NS = 100_000_000
BUSY = 0.8
CALM = 0.6
#: Latency samples the harness asks the load generator for when it keeps a record.
LATENCY_SAMPLES = 20_000


class Record:
    """What the wrapper has recorded since ``SIGUSR1``."""

    def __init__(self) -> None:
        self.on = False
        self.started_ns = 0
        self.stopped_ns = 0
        self._clear()

    def _clear(self) -> None:
        # per turn: start (monotonic ns), wall ns, busy ns
        self.turns = array("q")
        # per commit: start (monotonic ns), wall ns, then its batch's kinds
        self.commits = array("q")
        self.commit_kinds: list[dict[str, int]] = []

    def begin(self) -> None:
        """Record from now on, from nothing (a run's record never holds the one before's)."""
        self._clear()
        self.started_ns = time.monotonic_ns()
        self.on = True

    def to_json(self) -> dict[str, Any]:
        return {
            "started_ns": self.started_ns,
            "stopped_ns": self.stopped_ns,
            "turns": self.turns.tolist(),
            "commits": self.commits.tolist(),
            "commit_kinds": self.commit_kinds,
        }


def install(record: Record) -> None:
    """Time every loop turn and every group commit into ``record`` while ``record.on``."""
    sys.modules["uvloop"] = None  # type: ignore[assignment]  # uvicorn's auto loop: asyncio's
    clock = time.monotonic_ns
    handle_run = asyncio.events.Handle._run
    run_once = asyncio.base_events.BaseEventLoop._run_once
    busy = [0]

    def timed_run(self: asyncio.events.Handle) -> None:
        start = clock()
        handle_run(self)
        busy[0] += clock() - start

    def timed_run_once(self: asyncio.base_events.BaseEventLoop) -> None:
        if not record.on:
            run_once(self)
            return
        busy[0] = 0
        start = clock()
        run_once(self)
        record.turns.extend((start, clock() - start, busy[0]))

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = timed_run_once  # type: ignore[attr-defined]

    from persistence.group_commit import GroupCommit  # (after the patches: no loop made yet)

    init = GroupCommit.__init__

    def timed_init(self: GroupCommit[Any], flush: Any, **kwargs: Any) -> None:
        async def timed_flush(batch: list[Any]) -> None:
            if not record.on:
                await flush(batch)
                return
            start = clock()
            try:
                await flush(batch)
            finally:
                record.commits.extend((start, clock() - start))
                record.commit_kinds.append(dict(Counter(type(w).__name__ for w in batch)))

        init(self, timed_flush, **kwargs)

    GroupCommit.__init__ = timed_init  # type: ignore[method-assign]


def _wrap(argv: list[str]) -> None:
    record = Record()
    install(record)

    def stop(path: str) -> None:
        record.on = False
        record.stopped_ns = time.monotonic_ns()
        Path(path).write_text(json.dumps(record.to_json()))

    run_wrapped(argv, "bench.turns", record.begin, stop)


# -- the tables ---------------------------------------------------------------------------------


def _ms(value: float, digits: int = 1) -> str:
    """A figure for the tables; "-" where there was nothing to take it from."""
    return "-" if value != value else f"{value:.{digits}f}"


class Run:
    """One kept run: its record and its deltas' latency samples ((yield ns, ms) pairs)."""

    def __init__(self, name: str, data: dict[str, Any]) -> None:
        self.name = name
        self.started_ns: int = data["started_ns"]
        self.stopped_ns: int = data["stopped_ns"]
        t = data["turns"]
        self.turns = [(t[i], t[i + 1], t[i + 2]) for i in range(0, len(t), 3)]
        c = data["commits"]
        self.commits = [(c[i], c[i + 1]) for i in range(0, len(c), 2)]
        self.kinds: list[dict[str, int]] = data["commit_kinds"]
        self.samples: list[tuple[int, float]] = [tuple(s) for s in data.get("latency", [])]  # type: ignore[misc]

    def busy_by_window(self) -> dict[int, float]:
        """Each 100 ms window's share of time the loop's callbacks ran (a turn's busy time
        counted in the window it began in)."""
        busy: Counter[int] = Counter()
        for start, _, ns in self.turns:
            busy[(start - self.started_ns) // WINDOW_NS] += ns
        last = (self.stopped_ns - self.started_ns) // WINDOW_NS
        return {w: busy.get(w, 0) / WINDOW_NS for w in range(last)}


def load_dir(directory: Path) -> list[Run]:
    return [Run(p.stem, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def render(runs: Sequence[Run]) -> str:
    lines = [
        "Event-loop turns and group commits, timed in the server (`bench.turns`; asyncio's loop)",
        "",
        "| run | turns | loop busy | turn busy p50 / p90 / max ms | commits | commit p50 / p90 / "
        "max ms | median commit | slowest tenth of commits (mean) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        span = max(1, run.stopped_ns - run.started_ns)
        busy = [b / 1e6 for _, _, b in run.turns]
        walls = [w / 1e6 for _, w in run.commits]
        busy_p50, busy_p90, busy_max = percentiles(busy, 0.5, 0.9, 1)
        wall_p50, wall_p90, wall_max = percentiles(walls, 0.5, 0.9, 1)
        order = sorted(range(len(walls)), key=walls.__getitem__)
        slow = order[int(0.9 * len(order)) :]
        mid = order[len(order) // 2 : len(order) // 2 + 1]
        lines.append(
            f"| {run.name} | {len(run.turns):,} | {sum(busy) * 1e6 / span:.0%} | "
            f"{_ms(busy_p50, 2)} / {_ms(busy_p90, 2)} / {_ms(busy_max)} | "
            f"{len(walls):,} | {_ms(wall_p50)} / {_ms(wall_p90)} / {_ms(wall_max)}"
            f" | {_kinds(run.kinds, mid)} | {_kinds(run.kinds, slow)} |"
        )
    lines += [
        "",
        f"The deltas' latency by how busy the loop was in their {WINDOW_NS // 1_000_000} ms window "
        f"(busy: at least {BUSY:.0%}; calm: under {CALM:.0%})",
        "",
        "| run | windows busy | deltas' p50 ms, calm / busy | p99 ms | slowest 1% yielded in a "
        "busy window |",
        "|---|--:|--:|--:|--:|",
    ]
    for run in runs:
        if not run.samples:
            lines.append(f"| {run.name} | - | (no latency samples) | - | - |")
            continue
        windows = run.busy_by_window()
        busy_w = {w for w, share in windows.items() if share >= BUSY}
        calm_w = {w for w, share in windows.items() if share < CALM}

        placed = [((y - run.started_ns) // WINDOW_NS, ms) for y, ms in run.samples]
        calm = [ms for w, ms in placed if w in calm_w]
        hot = [ms for w, ms in placed if w in busy_w]
        p99 = percentile([ms for _, ms in placed], 0.99)
        slowest = [w for w, ms in placed if ms >= p99]
        in_busy = sum(1 for w in slowest if w in busy_w)
        lines.append(
            f"| {run.name} | {len(busy_w)} of {len(windows)} | {_ms(percentile(calm, 0.5))} / "
            f"{_ms(percentile(hot, 0.5))} | {_ms(p99)} | {in_busy / max(1, len(slowest)):.0%} |"
        )
    return "\n".join(lines)


def _kinds(kinds: list[dict[str, int]], picked: Sequence[int]) -> str:
    if not picked:
        return "-"
    total: Counter[str] = Counter()
    for i in picked:
        total.update(kinds[i])
    names = {"_Append": "appends", "_Create": "new", "_Audit": "audits"}
    return ", ".join(
        f"{total[k] / len(picked):.0f} {names.get(k, k)}" for k in sorted(total, key=str)
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 and args[1] == "--":
        _wrap(args)
        return 0
    return show_dir(
        args,
        module="bench.turns",
        doc=__doc__,
        option="--turns",
        what="records",
        load=load_dir,
        render=render,
    )


if __name__ == "__main__":
    sys.exit(main())

"""Where a benchmark server's CPU goes: the per-token path against everything else, by component.

Usage: ``python -m bench run --profile DIR ...`` profiles every measured run's server
(:mod:`bench.profiled`; the CPU figures of those runs are cProfile's, so inflated) and prints
these tables after its own; ``python -m bench.cpu_split DIR`` prints them again from the files.

Each function's own time (cProfile's ``tottime``) is put in one of two parts:

- **per token**: functions called at least once every ``1 / FREQUENT`` tokens of the run (the
  decoder, the state machine, a frame, a write, the engine's step), whose cost grows with the
  tokens;
- **per response or commit**: the rest, whose cost grows with the responses (the request, the
  prompt, the lifecycle events, sse-starlette's task group) or with the commits (the plan, the
  COPY, the transaction), each a few hundred tokens apart under load;

and in a component by the file it is defined in (``domain``, ``app/live.py``, ``persistence``,
``asyncpg``, ``anyio``, ``uvicorn``, the standard library's ``json`` and ``asyncio``, C
functions, ...). Both are shown in µs a token, so a target's parts add up to its whole profiled
CPU a token, and two targets under the same load compare part by part.

What it leaves out: threads other than the event loop's (SQLite's writer thread), the kernel's
work outside the calls that make it (a socket write's syscall is inside ``transport.write``, so
in its caller's own time when the transport is C code), and cProfile's own cost, which inflates
call-heavy code: compare targets under the same load, not a profiled figure with an unprofiled
one. cProfile counts by function, not by call site: a function called on both paths (a C
function such as ``json.dumps``' encoder, a dict method) counts where its total calls put it. A
coroutine's every resumption counts as a call. Its timer is the wall clock: a call that blocks
(a file's ``open`` while the disk's journal is busy) counts its wait.
"""

from __future__ import annotations

import collections
import itertools
import json
import pstats
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.kept import show_dir

__all__ = ["FREQUENT", "Split", "component", "load_dir", "render", "split"]

#: A function called at least this many times a token is on the per-token path.
FREQUENT = 0.25

_REPO = ("domain", "persistence", "bench")
_PACKAGES = {
    "asyncpg": "asyncpg",
    "sqlalchemy": "sqlalchemy",
    "greenlet": "sqlalchemy",
    "anyio": "anyio",
    "sniffio": "anyio",
    "sse_starlette": "sse_starlette",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httptools": "uvicorn",
}


def component(filename: str) -> str:
    """The component a function belongs to, from the file cProfile names (``~``: C code)."""
    if filename == "~":
        return "C functions"
    path = filename.replace("\\", "/")
    if "site-packages/" in path:
        package = path.split("site-packages/", 1)[1].split("/", 1)[0]
        return _PACKAGES.get(package, "other packages")
    parts = path.split("/")
    for part, below in itertools.pairwise(parts):  # each folder, with what is under it
        if part == "app":
            if below in ("live.py", "transport.py", "service.py", "http.py"):
                return f"app/{below}"
            return "app/engines" if below == "engines" else "app (other)"
        if part in _REPO:
            return part
        if part.startswith("python3"):
            return below if below in ("json", "asyncio") else "stdlib (other)"
    return "stdlib (other)" if path.startswith("<frozen") else "other"


@dataclass(frozen=True)
class Split:
    """One profile's own time, by (component, on the per-token path), over its tokens."""

    tokens: int
    responses: int
    seconds: Mapping[tuple[str, bool], float]
    calls: Mapping[bool, int]

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def us_per_token(self, component_: str | None = None, frequent: bool | None = None) -> float:
        """µs a token of a component (None: all) on one path (None: both)."""
        picked = sum(
            s
            for (c, f), s in self.seconds.items()
            if (component_ is None or c == component_) and (frequent is None or f == frequent)
        )
        return picked * 1e6 / self.tokens


def split(stats: pstats.Stats, tokens: int, responses: int, frequent: float = FREQUENT) -> Split:
    if tokens <= 0:
        raise ValueError("a split needs the tokens the profiled run delivered")
    seconds: dict[tuple[str, bool], float] = collections.defaultdict(float)
    calls: dict[bool, int] = collections.defaultdict(int)
    rows = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, ncalls, tottime, _, _) in rows.items():
        on_path = ncalls >= frequent * tokens
        seconds[(component(filename), on_path)] += tottime
        calls[on_path] += ncalls
    return Split(tokens, responses, dict(seconds), dict(calls))


@dataclass(frozen=True)
class Profiled:
    """One target's profiles at one concurrency, summed over its runs."""

    target: str
    concurrency: int
    split: Split


def load_dir(directory: Path) -> list[Profiled]:
    """Every ``<name>.prof`` with its ``<name>.json`` (``bench.harness`` writes both), the runs
    of one target at one concurrency summed."""
    groups: dict[tuple[str, int], list[tuple[Path, dict[str, Any]]]] = collections.defaultdict(list)
    for meta_path in sorted(directory.glob("*.json")):
        prof = meta_path.with_suffix(".prof")
        if prof.exists():
            meta = json.loads(meta_path.read_text())
            groups[(meta["target"], meta["concurrency"])].append((prof, meta))
    out = []
    for (target, concurrency), runs in groups.items():
        stats = pstats.Stats(str(runs[0][0]))
        for prof, _ in runs[1:]:
            stats.add(str(prof))
        tokens = sum(m["tokens"] for _, m in runs)
        responses = sum(m["streams"] for _, m in runs)
        out.append(Profiled(target, concurrency, split(stats, tokens, responses)))
    return out


def _order(components: Iterable[str], splits: Sequence[Split]) -> list[str]:
    return sorted(set(components), key=lambda c: -max(s.us_per_token(c) for s in splits))


def render(profiles: Sequence[Profiled]) -> str:
    """A table a concurrency: a row a component, per target its µs a token on the per-token path,
    on the rest, and both."""
    blocks = []
    for concurrency in sorted({p.concurrency for p in profiles}):
        cell = [p for p in profiles if p.concurrency == concurrency]
        splits = [p.split for p in cell]
        head = "| component | " + " | ".join(
            f"{p.target} per token | per response or commit | all" for p in cell
        )
        lines = [
            f"C={concurrency}: profiled µs a token, by component (cProfile's own time; per token: "
            f"called at least once every {1 / FREQUENT:g} tokens)",
            "",
            head + " |",
            "|---|" + "--:|--:|--:|" * len(cell),
        ]
        for name in _order((c for s in splits for c, _ in s.seconds), splits):
            values = " | ".join(
                f"{s.us_per_token(name, True):.2f} | {s.us_per_token(name, False):.2f} | {s.us_per_token(name):.2f}"
                for s in splits
            )
            lines.append(f"| {name} | {values} |")
        totals = " | ".join(
            f"**{s.us_per_token(None, True):.2f}** | **{s.us_per_token(None, False):.2f}** | **{s.us_per_token():.2f}**"
            for s in splits
        )
        lines.append(f"| **all** | {totals} |")
        calls = " | ".join(
            f"{s.calls.get(True, 0) / s.tokens:.1f} | {s.calls.get(False, 0) / s.tokens:.1f} | "
            f"{(s.calls.get(True, 0) + s.calls.get(False, 0)) / s.tokens:.1f}"
            for s in splits
        )
        lines.append(f"| calls a token | {calls} |")
        rest_a_response: list[str] = []
        for s in splits:  # under the middle column of each target
            rest_a_response += [
                "",
                f"{s.us_per_token(None, False) * s.tokens / max(s.responses, 1) / 1000:.2f} ms",
                "",
            ]
        lines.append("| the rest, a response | " + " | ".join(rest_a_response) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    return show_dir(
        argv,
        module="bench.cpu_split",
        doc=__doc__,
        option="--profile",
        what="profiles",
        load=load_dir,
        render=render,
    )


if __name__ == "__main__":
    sys.exit(main())

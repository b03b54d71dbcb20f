"""Where a benchmark server's CPU goes, sampled: py-spy's stacks, by component, in µs a token.

Usage: ``python -m bench run --sample DIR ...`` runs ``py-spy record`` (200 samples a second,
``--nonblocking``: the server is never paused) against every measured run's server, from the load
generator's start to its end, keeps each run's stacks in DIR (``<target>-c<C>-round<R>-rep<K>.txt``,
py-spy's "raw" collapsed format, with a ``.json`` of the run's tokens and server CPU), and prints
these tables after its own; ``python -m bench.samples DIR`` prints them again from the files.

Each sample is put in the component of its innermost Python frame's file, as ``bench.cpu_split``
names them (``domain``, ``app/live.py``, ``persistence``, ``asyncpg``, ``anyio``, the standard
library's ``json`` and ``asyncio``, ...), and a component's share of a run's samples is given as
that share of the server's CPU a token, which the harness measured in the same run. So, unlike
``--profile`` (cProfile, whose per-call overhead inflates call-heavy code several times and makes
up costs that are not there), the figures are the server's own and add up to its measured CPU a
token, and the run's other figures are barely moved (the sampler reads the server's memory from
its own process, on whichever core is free).

What sampling cannot say: how often a function was called (so no per-token/per-response split:
``--profile`` gives that), and where C code spends its time: a sample taken inside a C function
(a JSON encoder, a socket write, the kernel's work for a system call) counts for the Python frame
that called it. A thread blocked in a system call (the event loop waiting for I/O) is idle and
not sampled; every other thread is (SQLite's writer thread counts under ``persistence``). A
thread that is ready to run but waits for its core counts as running, so a server pinned to one
core with a second busy thread (SQLite's writer) gets more samples than CPU: the last row of
each table, samples per CPU-second at the rate, says how far off (measured: 0.64-0.79 for
one-threaded servers, whose shortest bursts the sampler misses; 1.07-1.14 for SQLite's). With
uvloop (uvicorn's choice when it is installed) the loop's own C code, its polling and the
callbacks' scheduling, counts under ``asyncio`` (the innermost Python frame is ``Runner.run``).
Needs ``py-spy`` (installed with the test dependencies) and the right to trace the server's
process (root, or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cpu_split import component
from bench.kept import show_dir

__all__ = ["GENERATED", "NO_FRAME", "RATE", "Sampled", "count", "load_dir", "py_spy", "render"]

#: Samples a second.
RATE = 200
#: The component of a sample with no Python frame (a thread in C code that Python did not call:
#: the collector, a driver's callback).
NO_FRAME = "no Python frame"
#: The component of code made at run time (``<string>``: the ``__init__`` dataclasses write).
GENERATED = "generated (<string>)"

# A frame of py-spy's raw format: ``function (file:line)``; a stack is its frames joined by ``;``
# (outermost first), then a space and how many samples had it.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")


def py_spy() -> str | None:
    """The ``py-spy`` executable: beside this interpreter (a virtual environment's), or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def count(lines: Iterable[str]) -> dict[str, int]:
    """Samples by the component of each stack's innermost frame (``component`` of its file)."""
    counts: dict[str, int] = collections.defaultdict(int)
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, samples = line.rpartition(" ")
        innermost = stack.rsplit(";", 1)[-1]
        match = _FRAME.match(innermost)
        if not stack.strip():
            name = NO_FRAME
        elif match is None:
            name = "other"
        elif match["file"] == "<string>":
            name = GENERATED
        else:
            name = component(match["file"])
        counts[name] += int(samples)
    return dict(counts)


@dataclass(frozen=True)
class Sampled:
    """One target's runs at one concurrency: samples by component, and the server's CPU a token
    (measured by the harness, the runs' tokens weighed)."""

    target: str
    concurrency: int
    samples: Mapping[str, int]
    tokens: int
    server_cpu_s: float

    @property
    def total(self) -> int:
        return sum(self.samples.values())

    @property
    def coverage(self) -> float:
        """Samples per second of the server's CPU, at ``RATE`` (1.0: one sample for each
        1/RATE s of CPU; see the module docstring for why it is not)."""
        return self.total / (self.server_cpu_s * RATE) if self.server_cpu_s else 0.0

    def us_per_token(self, component_: str | None = None) -> float:
        """A component's share of the samples (None: all) as µs of server CPU a token."""
        if not self.tokens or not self.total:
            return 0.0
        share = 1.0 if component_ is None else self.samples.get(component_, 0) / self.total
        return share * self.server_cpu_s * 1e6 / self.tokens


def load_dir(directory: Path) -> list[Sampled]:
    """Every ``<name>.txt`` with its ``<name>.json`` (``bench.harness`` writes both), the runs of
    one target at one concurrency summed."""
    groups: dict[tuple[str, int], list[tuple[Path, dict[str, Any]]]] = collections.defaultdict(list)
    for meta_path in sorted(directory.glob("*.json")):
        stacks = meta_path.with_suffix(".txt")
        if stacks.exists():
            meta = json.loads(meta_path.read_text())
            groups[(meta["target"], meta["concurrency"])].append((stacks, meta))
    out = []
    for (target, concurrency), runs in groups.items():
        samples: dict[str, int] = collections.defaultdict(int)
        for stacks, _ in runs:
            with stacks.open(encoding="utf-8", errors="replace") as lines:
                for name, n in count(lines).items():
                    samples[name] += n
        tokens = sum(m["tokens"] for _, m in runs)
        cpu = sum(m["server_cpu_s"] for _, m in runs)
        out.append(Sampled(target, concurrency, dict(samples), tokens, cpu))
    return out


def render(sampled: Sequence[Sampled]) -> str:
    """A table a concurrency: a row a component, per target its µs of CPU a token and its share
    of the samples."""
    blocks = []
    for concurrency in sorted({s.concurrency for s in sampled}):
        cell = [s for s in sampled if s.concurrency == concurrency]
        names = sorted(
            {name for s in cell for name in s.samples},
            key=lambda name: -max(s.us_per_token(name) for s in cell),
        )
        lines = [
            f"C={concurrency}: sampled µs of server CPU a token, by component (py-spy, "
            f"{RATE} a second; the innermost Python frame's file)",
            "",
            "| component | " + " | ".join(f"{s.target} µs a token | share" for s in cell) + " |",
            "|---|" + "--:|--:|" * len(cell),
        ]
        for name in names:
            values = " | ".join(
                f"{s.us_per_token(name):.2f} | {100 * s.samples.get(name, 0) / max(s.total, 1):.1f}%"
                for s in cell
            )
            lines.append(f"| {name} | {values} |")
        totals = " | ".join(f"**{s.us_per_token():.2f}** | {s.total:,} samples" for s in cell)
        lines.append(f"| **all** | {totals} |")
        coverage = " | ".join(f"{s.coverage:.2f} | " for s in cell)
        lines.append(f"| samples per CPU-second at the rate | {coverage}|")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    return show_dir(
        argv,
        module="bench.samples",
        doc=__doc__,
        option="--sample",
        what="samples",
        load=load_dir,
        render=render,
    )


if __name__ == "__main__":
    sys.exit(main())

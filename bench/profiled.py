"""Run a benchmark server under ``cProfile``, profiling only while a signal says so.

Usage: ``python -m bench.profiled OUT -- -m MODULE ARGS...`` or ``... OUT -- -c CODE ARGS...``
(what follows ``--`` is the server's own command line after ``python``).

The server runs as it would, unprofiled, until ``SIGUSR1``: from then on its main thread (the
event loop's: the HTTP server, the engine, the ledger's pipeline; not the SQLite writer thread)
is profiled. ``SIGUSR2`` stops the profile and writes it to ``OUT`` (written whole, then renamed
into place, so a reader that sees the file sees all of it). ``python -m bench run --profile DIR``
(``bench.harness``) sends both around each measured load, so the warm-up and the start-up are
not in it; :mod:`bench.cpu_split` reads the result.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["main", "run_wrapped"]


def run_wrapped(
    argv: list[str], module: str, start: Callable[[], None], stop: Callable[[str], None]
) -> None:
    """Run the server command line of ``OUT -- (-m MODULE | -c CODE) ARGS...`` in this process:
    ``start()`` on SIGUSR1; on SIGUSR2 ``stop(path)``, which writes its file at ``path``, then
    renamed to ``OUT`` (a reader that sees the file sees all of it). ``module``: the wrapper's
    name, for the usage line (``bench.turns`` runs servers this way too)."""
    if len(argv) < 4 or argv[1] != "--" or argv[2] not in ("-m", "-c"):
        raise SystemExit(f"usage: python -m {module} OUT -- (-m MODULE | -c CODE) ARGS...")
    out, mode, what, args = argv[0], argv[2], argv[3], argv[4:]

    def on_start(signum: int, frame: FrameType | None) -> None:
        start()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        tmp = f"{out}.tmp"
        stop(tmp)
        os.replace(tmp, out)

    signal.signal(signal.SIGUSR1, on_start)
    signal.signal(signal.SIGUSR2, on_stop)
    if mode == "-m":
        sys.argv = [what, *args]
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})  # our own command line


def main(argv: list[str]) -> None:
    profile = cProfile.Profile()

    def stop(path: str) -> None:
        profile.disable()
        profile.dump_stats(path)

    run_wrapped(argv, "bench.profiled", profile.enable, stop)


if __name__ == "__main__":
    main(sys.argv[1:])

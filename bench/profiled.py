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
from types import FrameType

__all__ = ["main"]


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[1] != "--" or argv[2] not in ("-m", "-c"):
        raise SystemExit("usage: python -m bench.profiled OUT -- (-m MODULE | -c CODE) ARGS...")
    out, mode, what, args = argv[0], argv[2], argv[3], argv[4:]
    profile = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        profile.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profile.disable()
        tmp = f"{out}.tmp"
        profile.dump_stats(tmp)
        os.replace(tmp, out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    if mode == "-m":
        sys.argv = [what, *args]
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})  # our own command line


if __name__ == "__main__":
    main(sys.argv[1:])

"""The command that prints a ``python -m bench run`` directory of kept run files again: what
``bench.cpu_split`` (``--profile``), ``bench.samples`` (``--sample``) and ``bench.turns``
(``--turns``) run as ``python -m <module> DIR``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["show_dir"]


def show_dir(
    argv: list[str] | None,
    *,
    module: str,
    doc: str,
    option: str,
    what: str,
    load: Callable[[Path], Sequence[Any]],
    render: Callable[[Sequence[Any]], str],
) -> int:
    """Parse ``DIR`` from ``argv``, load its ``what`` (``load``) and print ``render``'s tables;
    exit status 1 when it holds none."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0])
    parser.add_argument(
        "directory", type=Path, help=f"where `python -m bench run {option}` wrote its {what}"
    )
    directory = parser.parse_args(argv).directory
    kept = load(directory)
    if not kept:
        print(f"no {what} in {directory}", file=sys.stderr)
        return 1
    print(render(kept))
    return 0

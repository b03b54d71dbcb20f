"""Commands run as a developer runs them: from the repository's root, their output captured;
the caller checks the exit status."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from bench.targets import REPO_ROOT

#: A test's ``bench run``: no wait for an idle machine, nothing pinned to a core.
UNPINNED = ("--quiet-timeout", "0", "--server-cpus", "none", "--loadgen-cpus", "none")


def run(
    argv: Sequence[str], *, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def python_m(
    module: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m module args...`` with this interpreter."""
    return run([sys.executable, "-m", module, *args], timeout=timeout, env=env)

"""bench.codex_ws runs and prints its figures (one run per provider, no performance assertion)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.codex import codex_binary


@pytest.mark.codex
@pytest.mark.skipif(codex_binary() is None, reason="Codex CLI not installed")
def test_codex_ws_benchmark_prints_its_figures() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.codex_ws", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    openai = next(line for line in lines if line.startswith("| OpenAI (WebSocket)"))
    custom = next(line for line in lines if line.startswith("| custom (HTTP SSE)"))
    # both providers reached model output, and the socket was not retried
    assert "none" not in openai and "none" not in custom, proc.stdout
    assert openai.endswith("| 0/1 |"), proc.stdout

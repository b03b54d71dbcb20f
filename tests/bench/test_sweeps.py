"""``bench.sweeps`` on a small table: it fills it, finds every unfinished response through the
store's own calls, and prints each call's plan (no performance assertion)."""

from __future__ import annotations

import pytest

from bench.sweeps import _UNFINISHED_EVERY, main


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_sweep_and_the_cancel_requests_are_timed_with_their_plans(backend, capsys):
    rows = 3 * _UNFINISHED_EVERY
    assert main(["--rows", str(rows), "--backend", backend, "--reps", "1"]) == 0
    lines = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {backend} |")
    ]
    assert [line.split(" | ")[1] for line in lines] == ["sweep", "cancel_requests"]
    sweep, cancels = (line.split(" | ") for line in lines)
    assert sweep[3] == "3" and cancels[3] == "0"  # every unfinished one, none asked to cancel
    for columns in (sweep, cancels):
        assert "ix_responses_status" in columns[4]

"""``python -m bench.paced_path`` end to end, on tiny parameters (no performance assertion)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.targets import REPO_ROOT


def _paced_path(*extra: str) -> tuple[dict, str]:
    """``python -m bench.paced_path`` on SQLite, one rep, a step a millisecond, with ``extra``
    (streams, tokens, flags): its JSON report and all it printed."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.paced_path",
            "--backend",
            "sqlite",
            "--step-ms",
            "1",
            "--reps",
            "1",
            "--json",
            *extra,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    return report, proc.stdout


@pytest.mark.slow
def test_paced_path_runs_every_token_through_a_real_store_and_reports_it() -> None:
    report, printed = _paced_path("--streams", "4", "--tokens", "12", "--calls")
    assert report["backend"] == "sqlite"
    run = report["runs"][0]
    # 4 streams x (12 content tokens + the closing <|return|>): each token wrote a frame that a
    # commit made durable, every commit carried events, and the frames reached the streams
    assert run["us_per_token"] > 0 and run["commits"] >= 1 and run["events_per_commit"] >= 1
    assert run["bytes"] > 4 * 12 * len("event: response.output_text.delta\n")
    assert "| sqlite |" in printed
    # --calls: the Python calls a token of the run under cProfile, a few dozen, and more of all
    # calls (C functions too)
    assert 5 < report["python_calls_per_token"] < report["calls_per_token"] < 1000
    assert "| store | Python calls/token | all calls/token |" in printed


@pytest.mark.slow
def test_complete_ends_each_response_with_its_terminal_event() -> None:
    """``--complete``: each of the 3 responses also commits its ``response.completed``, one
    event more a stream than without (whose responses end with their output's done events)."""
    tiny = ("--streams", "3", "--tokens", "5")
    plain = _paced_path(*tiny)[0]["runs"][0]
    complete = _paced_path(*tiny, "--complete")[0]["runs"][0]
    # (each stream's tokens: the channel header's, the five words', the closing <|return|>)
    assert plain["tokens"] == complete["tokens"] == 3 * (3 + 5 + 1)
    assert complete["events"] == plain["events"] + 3

"""``python -m bench run --rounds N``: every cell once a round, ratios paired by round."""

from __future__ import annotations

import pytest

from bench.__main__ import main
from bench.harness import RunResult, summarize


def _run(target: str, round_: int, tokens_per_s: float, rep: int = 0) -> RunResult:
    return RunResult(target, 64, rep, round=round_, tokens_per_s=tokens_per_s)


def test_a_ratio_over_rounds_is_the_median_of_each_rounds_ratio():
    # round 0 ran on a fast spell (the peer 100), round 1 on a slow one (the peer 50)
    results = [
        _run("naive", 0, 100.0), _run("ledger", 0, 110.0),
        _run("naive", 1, 50.0), _run("ledger", 1, 45.0),
        _run("naive", 2, 80.0), _run("ledger", 2, 100.0),
    ]  # fmt: skip
    cells = {s.target: s for s in summarize(results)}
    # the median of 1.1, 0.9 and 1.25; the ratio of the medians (100 / 80) would say 1.25
    assert cells["ledger"].ratio_to_naive == pytest.approx(1.1)
    assert cells["naive"].ratio_to_naive == pytest.approx(1.0)
    assert cells["ledger"].tokens_per_s == 100.0  # tokens/s stays the median of every run
    assert cells["ledger"].reps == 3


def test_reps_within_a_round_count_as_that_rounds_median():
    results = [
        _run("naive", 0, 100.0), _run("ledger", 0, 70.0, rep=0), _run("ledger", 0, 90.0, rep=1),
        _run("naive", 1, 100.0), _run("ledger", 1, 95.0, rep=0), _run("ledger", 1, 105.0, rep=1),
    ]  # fmt: skip
    cells = {s.target: s for s in summarize(results)}
    # the median of 0.8 and 1.0; of all four runs' median (92.5) over 100, 0.925
    assert cells["ledger"].ratio_to_naive == pytest.approx(0.9)


def test_one_round_keeps_the_ratio_of_the_medians():
    results = [_run("naive", 0, 100.0, rep=r) for r in range(3)] + [
        _run("ledger", 0, v, rep=r) for r, v in enumerate((60.0, 90.0, 120.0))
    ]
    cells = {s.target: s for s in summarize(results)}
    assert cells["ledger"].ratio_to_naive == pytest.approx(0.9)


def test_a_round_the_reference_failed_in_is_left_out_of_the_ratio():
    results = [
        _run("naive", 0, 100.0), _run("ledger", 0, 50.0),
        RunResult("naive", 64, 0, round=1, failure="crashed"), _run("ledger", 1, 500.0),
        _run("naive", 2, 100.0), _run("ledger", 2, 70.0),
    ]  # fmt: skip
    cells = {s.target: s for s in summarize(results)}
    # rounds 0 and 2 only (0.5 and 0.7); the medians over all runs would say 0.7
    assert cells["ledger"].ratio_to_naive == pytest.approx(0.6)


@pytest.mark.parametrize("flag", ["--rounds", "--reps"])
def test_rounds_and_reps_below_one_are_refused(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--target", "naive", flag, "0"])
    assert exit_.value.code == 2
    assert "--rounds and --reps take 1 or more" in capsys.readouterr().err

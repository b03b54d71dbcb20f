"""``bench.sqlite_pages`` on tiny parameters: each layout stores every event, and the table
prints (no performance assertion)."""

from __future__ import annotations

import pytest

from bench.sqlite_pages import main, run_churn, run_layout


def test_each_layout_stores_every_event_and_counts_wal_frames():
    for move_every, foreign_key, keyed in (
        (None, False, False),
        (None, True, False),
        (5, False, False),
        (5, False, True),
    ):
        result = run_layout(
            logs=8,
            steps=50,
            history=3,
            move_every=move_every,
            foreign_key=foreign_key,
            responses=10,
            keyed_tail=keyed,
        )
        assert result["us_per_event"] > 0
        assert 0 < result["commit_p50_ms"] <= result["commit_p99_ms"]
        assert (result["move_max_ms"] > 0) == (move_every is not None)
        assert result["frames_per_event"] > 0  # the checkpoint after commit 50 saw the WAL


def test_the_table_names_every_layout(capsys):
    assert (
        main(["--logs", "4", "--steps", "50", "--history", "2", "--moves", "5,10", "--reps", "1"])
        == 0
    )
    out = capsys.readouterr().out
    for name in (
        "| indexed |",
        "| indexed + foreign key |",
        "| tail + move every 5 |",
        "| tail + move every 10 |",
        "| keyed tail + move every 5 |",
    ):
        assert name in out


def test_a_keyed_tail_needs_moves():
    with pytest.raises(ValueError, match="move_every"):
        run_layout(logs=2, steps=2, history=0, move_every=None, keyed_tail=True)


def test_churn_copies_each_finished_log_whole_and_prints_both_layouts(capsys):
    for queue in (False, True):
        result = run_churn(logs=6, length=10, commits=60, history=2, queue=queue)
        assert result["us_per_event"] > 0
        assert 0 < result["commit_p50_ms"] <= result["commit_p99_ms"] <= result["commit_max_ms"]
        assert result["frames_per_event"] > 0  # the checkpoint after commit 50 saw the WAL
    assert (
        main(["--logs", "4", "--steps", "10", "--history", "1", "--churn", "50", "--reps", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "| indexed + foreign key |" in out and "| queue + copy at finish |" in out

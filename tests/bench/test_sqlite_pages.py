"""``bench.sqlite_pages`` on tiny parameters: each layout stores every event, and the table
prints (no performance assertion)."""

from __future__ import annotations

from bench.sqlite_pages import main, run_layout


def test_each_layout_stores_every_event_and_counts_wal_frames():
    for move_every, foreign_key in ((None, False), (None, True), (5, False)):
        result = run_layout(
            logs=8, steps=50, history=3, move_every=move_every, foreign_key=foreign_key, responses=10
        )
        assert result["us_per_event"] > 0
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
    ):
        assert name in out

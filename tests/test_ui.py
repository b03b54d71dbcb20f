"""The audit page's timing figures (``app.ui.timeline``, ``svg_timeline``), from known commit times."""

from __future__ import annotations

import pytest

from app.ui import svg_timeline, timeline

D = "response.output_text.delta"


def test_commits_ttft_rate_and_a_pause() -> None:
    t0 = 1_800_000_000.0
    times = [
        (0, "response.created", t0),
        (1, "response.in_progress", t0),
        (2, "response.output_item.added", t0 + 0.100),
        (3, D, t0 + 0.100),  # the first token, 100 ms in
        (4, D, t0 + 0.110),
        (5, D, t0 + 0.120),
        (6, D, t0 + 1.120),  # a 1 s pause after seq 5
        (7, D, t0 + 1.130),
        (8, "response.completed", t0 + 1.130),
    ]
    line = timeline(times)
    assert line["events"] == 9
    assert line["ttft"] == pytest.approx(0.100)
    assert line["deltas"] == 5
    assert line["rate"] == pytest.approx(4 / 1.030)
    assert [b[1:] for b in line["batches"]] == [[0, 1], [2, 3], [4, 4], [5, 5], [6, 6], [7, 8]]
    assert line["batch_max"] == 2
    assert [(p["after_seq"], round(p["seconds"], 3)) for p in line["pauses"]] == [(5, 1.0)]
    assert line["times"] == [0.0, 0.0, 100.0, 100.0, 110.0, 120.0, 1120.0, 1130.0, 1130.0]
    svg = svg_timeline(line)
    assert len(svg["dots"]) == 6 and svg["ttft_x"] is not None and len(svg["pauses"]) == 1
    assert svg["left"] < svg["pauses"][0][0] < svg["pauses"][0][1] <= svg["right"]


def test_a_long_log_draws_a_bounded_line() -> None:
    times = [(i, D, 1_800_000_000.0 + i * 0.01) for i in range(20_000)]
    svg = svg_timeline(timeline(times))
    assert svg["dots"] == []  # over MAX_DOTS commits: the line only
    assert len(svg["points"].split()) <= 2 * 2 * 900


def test_an_empty_log() -> None:
    line = timeline([])
    assert line["events"] == 0 and line["times"] == []

"""``bench.reads`` on a small store: every figure printed, with the statistics ``ANALYZE``
leaves (no performance assertion)."""

from __future__ import annotations

from bench.reads import main


async def test_the_table_has_a_row_per_count_and_every_column(capsys):
    await main(["--others", "3", "--turn-words", "5", "--analyze"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3 |")]
    assert len(rows) == 1
    figures = rows[0].strip("| ").split(" | ")[1:]
    assert len(figures) == 5 and all(float(f) > 0 for f in figures)

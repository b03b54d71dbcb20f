"""The benchmarks' one percentile (``bench.stats``): nearest rank, whatever the order."""

from __future__ import annotations

import math
import random

from bench.stats import percentile, percentiles


def test_percentiles_by_nearest_rank_sorting_once_as_one_at_a_time() -> None:
    values = list(range(1, 101))  # 1..100
    random.Random(7).shuffle(values)
    assert percentile(values, 0.5) == 51 and percentile(values, 0.99) == 100
    assert percentile(values, 0.0) == 1 and percentile(values, 1) == 100
    qs = (0.0, 0.25, 0.5, 0.9, 0.99, 1)
    assert (
        percentiles(values, *qs) == [percentile(values, q) for q in qs] == [1, 26, 51, 91, 100, 100]
    )
    assert all(math.isnan(v) for v in percentiles([], 0.5, 0.99))
    assert math.isnan(percentile([], 0.5))

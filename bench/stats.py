"""Figures of a list of measurements, for the benchmarks' tables."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile", "percentiles"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, in any order, by nearest rank (the value below
    which ``q`` of them lie; ``q = 1``: the largest); NaN when there are none."""
    return percentiles(values, q)[0]


def percentiles(values: Sequence[float], *qs: float) -> list[float]:
    """``percentile(values, q)`` for each of ``qs``, the values sorted once."""
    if not values:
        return [float("nan")] * len(qs)
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in qs]

"""Figures of a list of measurements, for the benchmarks' tables."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, in any order, by nearest rank (the value below
    which ``q`` of them lie; ``q = 1``: the largest); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

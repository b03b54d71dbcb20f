"""``bench.harness.commit_counts``: the slow commits of a run, read from a ledger's /metrics."""

from __future__ import annotations

from app.metrics import _LATENCY_BUCKETS, Histogram
from bench.harness import SLOW_COMMIT_S, commit_counts


def test_commits_over_the_bound_are_counted_from_the_ledgers_own_histogram() -> None:
    histogram = Histogram("ledger_commit_latency_seconds", "commits", _LATENCY_BUCKETS)
    for seconds in (0.002, 0.04, 0.1, 0.1001, 0.36, 2.0):
        histogram.observe(seconds)
    other = Histogram("ledger_commit_batch_events", "events", (1, 2, 4))
    other.observe(1)
    text = other.exposition() + histogram.exposition()
    assert (
        float(SLOW_COMMIT_S) == 0.1 and float(SLOW_COMMIT_S) in _LATENCY_BUCKETS
    )  # (a bound it renders)
    assert commit_counts(text) == (3, 6)  # 0.1 itself is within the bucket, as Prometheus counts
    assert commit_counts(other.exposition()) is None

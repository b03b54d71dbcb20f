"""``app.metrics.Histogram`` against prometheus_client's own, sample for sample, through its
family and through the text it writes itself."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as PromHistogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from app.metrics import Histogram


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_lock_free_histogram_exposes_what_prometheus_client_would() -> None:
    buckets = (0.001, 0.01, 0.1, 1.0)
    values = [0.0, 0.001, 0.0011, 0.01, 0.5, 1.0, 3.0, 0.05, 0.05]
    ours = Histogram("x_seconds", "x", buckets)
    theirs_registry = CollectorRegistry()
    theirs = PromHistogram("x_seconds", "x", buckets=buckets, registry=theirs_registry)
    for value in values:
        ours.observe(value)
        theirs.observe(value)

    class One(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            yield ours.family()

    ours_registry = CollectorRegistry()
    ours_registry.register(One())
    expected = {
        key: value
        for key, value in _samples(generate_latest(theirs_registry).decode()).items()
        if not key[0].endswith("_created")
    }
    assert _samples(generate_latest(ours_registry).decode()) == expected
    assert _samples(ours.exposition()) == expected  # written directly, parsed the same
    assert ours.count == len(values)
    ours.observe(7.0)  # folded in with what was folded before
    assert _samples(ours.exposition())[("x_seconds_count", ())] == len(values) + 1

"""A ``/metrics`` scrape as the tests read it: every sample, ``name{label="v",...}`` -> value
(labels sorted; a sample without labels is its bare name), parsed with prometheus_client's
parser as Prometheus would."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["samples"]


def samples(exposition: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            found[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return found

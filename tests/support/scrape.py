"""Reading a Prometheus scrape into samples by name and labels, for the metrics tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


LAB_A_200 = {"route": "lab", "host": "gpu-a", "code": "200"}


def samples(text: bytes) -> Samples:
    """Every sample of a scrape, by name and labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[sample.name, frozenset(sample.labels.items())] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))

"""crossbar.stats.tokenmetrics: the tokens each answer reported, by route, host, model and
key, and the first token's time and generation speed, as Prometheus scrapes them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from crossbar.stats.record import RequestRecord
from crossbar.stats.tokenmetrics import UsageCounts

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
LAB = {"route": "lab", "host": "gpu-a"}


def scraped(counts: UsageCounts) -> Samples:
    """Each sample of the scrape, by its name and labels, read back from Prometheus's text."""
    registry = CollectorRegistry()
    registry.register(counts)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def at(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def record(**fields: object) -> RequestRecord:
    return RequestRecord("lab", "gpu-a", 200, 1.0, **fields)  # type: ignore[arg-type]


def test_tokens_add_up_by_key_and_kind() -> None:
    counts = UsageCounts()
    counts.count(
        record(key="alice", prompt_tokens=100, cached_tokens=80, generated_tokens=20),
        "lab",
        "gpu-a",
        "qwen",
    )
    counts.count(record(key="alice", prompt_tokens=50, generated_tokens=5), "lab", "gpu-a", "qwen")
    counts.count(record(key="bob", prompt_tokens=9), "lab", "gpu-a", "qwen")
    got = scraped(counts)

    alice = {**LAB, "model": "qwen", "key": "alice"}
    assert at(got, "crossbar_tokens_total", **alice, kind="prompt") == 150
    assert at(got, "crossbar_tokens_total", **alice, kind="cached") == 80
    assert at(got, "crossbar_tokens_total", **alice, kind="generated") == 25
    assert at(got, "crossbar_tokens_total", **LAB, model="qwen", key="bob", kind="prompt") == 9


def test_without_keys_usage_goes_to_the_route_and_nothing_reported_adds_no_line() -> None:
    counts = UsageCounts()
    counts.count(record(prompt_tokens=7), "lab", "gpu-a", "other")
    counts.count(record(), "lab", "gpu-b", "qwen")  # refused, or no usage in the answer
    got = scraped(counts)

    tokens = {labels for name, labels in got if name == "crossbar_tokens_total"}
    assert tokens == {frozenset({**LAB, "model": "other", "key": "lab", "kind": "prompt"}.items())}
    assert at(got, "crossbar_tokens_total", **LAB, model="other", key="lab", kind="prompt") == 7


def test_first_token_and_speed_fall_into_their_buckets() -> None:
    counts = UsageCounts()
    counts.count(record(first_token=0.3, tokens_per_second=42.0), "lab", "gpu-a", "qwen")
    counts.count(record(first_token=3.0, tokens_per_second=42.0), "lab", "gpu-a", "qwen")
    got = scraped(counts)

    first = "crossbar_time_to_first_token_seconds_bucket"
    assert at(got, first, **LAB, le="0.25") == 0
    assert at(got, first, **LAB, le="0.5") == 1
    assert at(got, first, **LAB, le="5.0") == 2
    assert at(got, first, **LAB, le="+Inf") == 2
    assert at(got, "crossbar_time_to_first_token_seconds_sum", **LAB) == 3.3
    assert at(got, "crossbar_time_to_first_token_seconds_count", **LAB) == 2
    speed = "crossbar_generation_tokens_per_second_bucket"
    assert at(got, speed, **LAB, le="20.0") == 0
    assert at(got, speed, **LAB, le="50.0") == 2


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    counts = UsageCounts()
    counts.count(record(first_token=0.5), "lab", "gpu-a", "qwen")
    got = scraped(counts)

    first = "crossbar_time_to_first_token_seconds_bucket"
    assert at(got, first, **LAB, le="0.25") == 0
    assert at(got, first, **LAB, le="0.5") == 1
    assert at(got, "crossbar_generation_tokens_per_second_count", **LAB) is None

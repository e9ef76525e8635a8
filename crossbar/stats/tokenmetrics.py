"""Who used what, for Prometheus: the tokens each answer reported (prompt, of those cached,
generated) and the model loads requests made hosts begin, by route, host, model and key,
and the first token's time and the generation speed by route and host. Counted per
request in plain dicts, made into families when scraped, as the other request metrics are."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from crossbar.stats.record import RequestRecord

FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""From a request's arrival to its answer's first content event (prefill included)."""
SPEED_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Tokens a second of generation."""


class _Histogram:
    __slots__ = ("buckets", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.buckets = [0] * (len(bounds) + 1)
        self.total = 0.0


class UsageCounts:
    """The token counters and the two histograms; ``count`` is on every request's path."""

    def __init__(self) -> None:
        self.tokens: dict[tuple[str, str, str, str, str], int] = {}
        self.loads: dict[tuple[str, str, str, str], int] = {}
        self.first: dict[tuple[str, str], _Histogram] = {}
        self.speed: dict[tuple[str, str], _Histogram] = {}

    def count(self, record: RequestRecord, route: str, host: str, model: str) -> None:
        """One ended request; ``model`` as the metrics show it (``(other)`` when no host
        lists it, ``(none)`` when none was asked for). Without keys, usage goes to the route."""
        key = record.key or route
        tokens = self.tokens
        for kind, value in (
            ("prompt", record.prompt_tokens),
            ("cached", record.cached_tokens),
            ("generated", record.generated_tokens),
        ):
            if value:
                labels = (route, host, model, key, kind)
                tokens[labels] = tokens.get(labels, 0) + value
        if record.loads:
            where = (route, host, model, key)
            self.loads[where] = self.loads.get(where, 0) + record.loads
        if record.first_token is not None:
            _add(self.first, (route, host), FIRST_TOKEN_BUCKETS, record.first_token)
        if record.tokens_per_second is not None:
            _add(self.speed, (route, host), SPEED_BUCKETS, record.tokens_per_second)

    def collect(self) -> Iterable[Metric]:
        tokens = CounterMetricFamily(
            "crossbar_tokens",
            "Tokens the answers reported, by route, host, model, key (a key's name, else the "
            "route) and kind: prompt (every prompt token, cached ones included), cached (read "
            "from the host's prompt cache) or generated.",
            labels=["route", "host", "model", "key", "kind"],
        )
        for named, count in self.tokens.items():
            tokens.add_metric(list(named), count)
        loads = CounterMetricFamily(
            "crossbar_key_model_loads",
            "Loads of a model requests made hosts begin (the model loaded on no healthy host "
            "of the route, no load of it under way), by route, host, model and key; "
            "crossbar_model_loads_total counts the loads polls saw, whoever made them.",
            labels=["route", "host", "model", "key"],
        )
        for where, count in self.loads.items():
            loads.add_metric(list(where), count)
        first = HistogramMetricFamily(
            "crossbar_time_to_first_token_seconds",
            "Time from a request's arrival to its answer's first content event.",
            labels=["route", "host"],
        )
        speed = HistogramMetricFamily(
            "crossbar_generation_tokens_per_second",
            "Generation speed of answers, as the host timed it or crossbar saw it.",
            labels=["route", "host"],
        )
        for family, counts, bounds in (
            (first, self.first, FIRST_TOKEN_BUCKETS),
            (speed, self.speed, SPEED_BUCKETS),
        ):
            for labels, histogram in counts.items():
                cumulative, buckets = 0, []
                for bound, n in zip((*bounds, math.inf), histogram.buckets, strict=True):
                    cumulative += n
                    buckets.append((floatToGoString(bound), cumulative))
                family.add_metric(list(labels), buckets, histogram.total)
        return [tokens, loads, first, speed]


def _add(
    counts: dict[tuple[str, str], _Histogram],
    labels: tuple[str, str],
    bounds: tuple[float, ...],
    value: float,
) -> None:
    histogram = counts.get(labels) or counts.setdefault(labels, _Histogram(bounds))
    histogram.buckets[bisect_left(bounds, value)] += 1
    histogram.total += value

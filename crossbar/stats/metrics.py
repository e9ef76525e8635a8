"""Prometheus metrics for crossbar, in a registry of its own.

Request metrics are counted as each proxied request ends (:meth:`Metrics.request_done`
is the proxy's observer). Fleet metrics (in flight, host up, polls) are not copied
anywhere: a collector reads them from the health table and the traffic at scrape time.
The registry is per :class:`Metrics`, never the process-wide one, so that any number
of crossbars (as in the tests) can live in one process.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString
from twisted.internet.interfaces import IReactorTime

from crossbar.config import Reloads
from crossbar.polling import HealthTable
from crossbar.queueing import Traffic
from crossbar.stats.queuemetrics import QueueCollector
from crossbar.stats.record import NO_MODEL, OTHER_MODEL, RequestRecord
from crossbar.stats.tokenmetrics import UsageCounts

__all__ = ["CONTENT_TYPE", "Metrics", "merge_workers"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
NO_HOST = "-"
"""The ``host`` label of a request that never reached a host (bad path, no healthy host)."""

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
"""Whole requests: a streamed generation can run for minutes."""
FIRST_BYTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Up to the upstream's answer head: includes prompt processing and any model load."""
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Waits in crossbar for a free slot."""


class _Waits:
    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(WAIT_BUCKETS) + 1)
        self.total = 0.0


class _FleetCollector:
    """Reads host gauges and poll counters from the table and the traffic when scraped."""

    def __init__(self, table: HealthTable, traffic: Traffic) -> None:
        self._table = table
        self._traffic = traffic

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        up, polls, failures, in_flight = families = self._families()
        in_flight_now = self._traffic.in_flight
        for name, state in self._table.snapshot().items():
            up.add_metric([name], 1 if state.healthy else 0)
            polls.add_metric([name], state.polls)
            failures.add_metric([name], state.poll_failures)
            in_flight.add_metric([name], in_flight_now.get(name, 0))
        return families

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily
    ]:
        return (
            GaugeMetricFamily(
                "crossbar_host_up", "1 if the host is healthy, else 0.", labels=["host"]
            ),
            CounterMetricFamily(
                "crossbar_polls", "Health polls of the host that ended.", labels=["host"]
            ),
            CounterMetricFamily(
                "crossbar_poll_failures", "Health polls of the host that failed.", labels=["host"]
            ),
            GaugeMetricFamily(
                "crossbar_in_flight_requests",
                "Proxied requests the host is serving now.",
                labels=["host"],
            ),
        )


class ClientConnections(Protocol):
    """What a listening site counts of its client connections (crossbar.http's Site)."""

    refused_connections: int

    @property
    def open_connections(self) -> int: ...

    @property
    def refused_requests(self) -> Mapping[tuple[int, str], int]: ...

    @property
    def closed_idle_connections(self) -> Mapping[str, int]: ...


IDLE_CLOSED_FOR = ("max_connections", "max_connections_per_client")
"""The limits an idle connection is closed for, to make room for a new one."""


class _ConnectionsCollector:
    """Reads a site's connection counts when scraped: nothing is copied per connection."""

    def __init__(self, site: ClientConnections) -> None:
        self._site = site

    def collect(self) -> Iterable[Metric]:
        refused = CounterMetricFamily(
            "crossbar_connections_refused",
            "Client connections closed at once because max_connections were open.",
            value=self._site.refused_connections,
        )
        open_now = GaugeMetricFamily(
            "crossbar_client_connections",
            "Client connections open now.",
            value=self._site.open_connections,
        )
        requests = CounterMetricFamily(
            "crossbar_requests_refused",
            "Requests refused from their head alone (bad request, unauthorized, limits).",
            labels=["code", "reason"],
        )
        for (code, reason), count in sorted(self._site.refused_requests.items()):
            requests.add_metric([str(code), reason], count)
        closed = CounterMetricFamily(
            "crossbar_connections_closed_idle",
            "Idle client connections closed to make room for new ones, by the limit reached: "
            "max_connections (all open) or max_connections_per_client (the client's share).",
            labels=["limit"],
        )
        closed_idle = self._site.closed_idle_connections
        for limit in IDLE_CLOSED_FOR:
            closed.add_metric([limit], closed_idle.get(limit, 0))
        return [refused, open_now, requests, closed]


class _ReloadsCollector:
    """Reads the config's reloads when scraped."""

    def __init__(self, reloads: Reloads) -> None:
        self._reloads = reloads

    def collect(self) -> Iterable[Metric]:
        reloads = self._reloads
        total = CounterMetricFamily(
            "crossbar_config_reloads",
            "Config reloads asked for (SIGHUP or POST /_crossbar/reload), by result: ok, or "
            "refused (the config in force kept serving).",
            labels=["result"],
        )
        total.add_metric(["ok"], reloads.ok)
        total.add_metric(["refused"], reloads.refused)
        loaded = GaugeMetricFamily(
            "crossbar_config_loaded_timestamp_seconds",
            "When the config in force was read, in seconds since the epoch.",
            value=reloads.loaded_at,
        )
        return [total, loaded]


class _ByHost:
    """What the requests of one (route, host) add up to, as plain numbers."""

    __slots__ = ("duration", "duration_sum", "first_byte", "first_byte_sum", "sent")

    def __init__(self) -> None:
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.first_byte = [0] * (len(FIRST_BYTE_BUCKETS) + 1)
        self.first_byte_sum = 0.0
        self.sent = 0


def _histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    bounds: tuple[float, ...],
    counts: list[int],
    total: float,
) -> None:
    cumulative, buckets = 0, []
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        cumulative += count
        buckets.append((floatToGoString(bound), cumulative))
    family.add_metric(labels, buckets, total)


class _RequestCounts:
    """The per-request metrics, counted in plain dicts and lists and made into families
    only when scraped. prometheus_client's own ``Counter`` and ``Histogram`` take a lock
    for every increment and walk a histogram's bounds in Python: seven locks and two
    walks for every request, 1.7 µs, against 0.25 µs here. The text is the same."""

    def __init__(self) -> None:
        self.codes: dict[tuple[str, str, int], int] = {}
        self.by_host: dict[tuple[str, str], _ByHost] = {}
        self.models: dict[tuple[str, str], int] = {}
        self.affinity: dict[tuple[str, str, str], int] = {}
        self.waits: dict[str, _Waits] = {}
        self.shed: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterable[Metric]:
        by_host = ["route", "host"]
        requests = CounterMetricFamily(
            "crossbar_requests",
            "Requests answered, by route, host and HTTP status (499: the client left first).",
            labels=[*by_host, "code"],
        )
        for (route, host, code), count in self.codes.items():
            requests.add_metric([route, host, str(code)], count)
        duration = HistogramMetricFamily(
            "crossbar_request_duration_seconds",
            "Time from a request's arrival to the end of its answer.",
            labels=by_host,
        )
        first_byte = HistogramMetricFamily(
            "crossbar_time_to_first_byte_seconds",
            "Time from a request's arrival until the host's answer began.",
            labels=by_host,
        )
        sent = CounterMetricFamily(
            "crossbar_response_bytes",
            "Bytes of upstream answers streamed to clients.",
            labels=by_host,
        )
        for (route, host), counts in self.by_host.items():
            labels = [route, host]
            _histogram(duration, labels, DURATION_BUCKETS, counts.duration, counts.duration_sum)
            _histogram(
                first_byte, labels, FIRST_BYTE_BUCKETS, counts.first_byte, counts.first_byte_sum
            )
            sent.add_metric(labels, counts.sent)
        models = CounterMetricFamily(
            "crossbar_model_requests",
            "Requests by route and the model they asked for ((other): one no host knows).",
            labels=["route", "model"],
        )
        for (route, model), count in self.models.items():
            models.add_metric([route, model], count)
        affinity = CounterMetricFamily(
            "crossbar_affinity",
            "cache_affinity requests by route, the host they went to, and outcome: new "
            "(a conversation not seen before, at its home), home, or moved.",
            labels=["route", "host", "outcome"],
        )
        for labels_, count in self.affinity.items():
            affinity.add_metric(list(labels_), count)
        waited = HistogramMetricFamily(
            "crossbar_wait_seconds",
            "Time requests waited in crossbar for a free slot before they were sent, by route.",
            labels=["route"],
        )
        for route, waits in self.waits.items():
            _histogram(waited, [route], WAIT_BUCKETS, waits.buckets, waits.total)
        shed = CounterMetricFamily(
            "crossbar_shed_requests",
            "Requests answered without a host by the queue, by route and reason: limit "
            "(max_waiting), timeout (wait_timeout) or stopping.",
            labels=["route", "reason"],
        )
        for (route, reason), count in self.shed.items():
            shed.add_metric([route, reason], count)
        return [requests, duration, first_byte, sent, models, affinity, waited, shed]


class Metrics:
    """The proxy's observer and the source of ``/_crossbar/metrics``."""

    def __init__(
        self, table: HealthTable, traffic: Traffic, clock: IReactorTime | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._counts = _RequestCounts()
        self.registry.register(self._counts)
        self._table = table
        self.registry.register(_FleetCollector(table, traffic))
        self.registry.register(QueueCollector(traffic, clock.seconds if clock else time.time))
        self._usage = UsageCounts()
        self.registry.register(self._usage)

    def count_connections(self, site: ClientConnections) -> None:
        """Publish the client connections of ``site`` (the main listener's), read when
        scraped."""
        self.registry.register(_ConnectionsCollector(site))

    def count_reloads(self, reloads: Reloads) -> None:
        """Publish the config's reloads, read when scraped."""
        self.registry.register(_ReloadsCollector(reloads))

    def request_done(self, record: RequestRecord) -> None:
        """Count one ended request (on every request's path: plain numbers, no locks).
        One refused at the door is counted by its site (``refused_requests``)."""
        if record.refused:
            return
        counts = self._counts
        route = record.route
        host = NO_HOST if record.host is None else record.host
        key = (route, host, record.status)
        codes = counts.codes
        codes[key] = codes.get(key, 0) + 1
        mine = counts.by_host.get((route, host))
        if mine is None:
            mine = counts.by_host[route, host] = _ByHost()
        seconds = record.seconds
        mine.duration[bisect_left(DURATION_BUCKETS, seconds)] += 1
        mine.duration_sum += seconds
        first_byte = record.first_byte
        if first_byte is not None:
            mine.first_byte[bisect_left(FIRST_BYTE_BUCKETS, first_byte)] += 1
            mine.first_byte_sum += first_byte
        mine.sent += record.sent
        label = NO_MODEL
        if record.model is not None:
            label = record.model if self._table.knows(record.model) else OTHER_MODEL
            models = counts.models
            models[route, label] = models.get((route, label), 0) + 1
        if record.prompt_tokens is not None or record.first_token is not None or record.loads:
            self._usage.count(record, route, host, label)
        if record.affinity is not None:
            placed = (route, host, record.affinity)
            counts.affinity[placed] = counts.affinity.get(placed, 0) + 1
        if record.waited is not None:
            waited = counts.waits.get(route) or counts.waits.setdefault(route, _Waits())
            waited.buckets[bisect_left(WAIT_BUCKETS, record.waited)] += 1
            waited.total += record.waited
        if record.shed is not None:
            why = (route, record.shed)
            counts.shed[why] = counts.shed.get(why, 0) + 1

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric, for a scrape."""
        return generate_latest(self.registry)


class _Fixed:
    """A collector that yields families built elsewhere."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def merge_workers(texts: Mapping[str, bytes]) -> bytes:
    """One exposition of several workers' expositions, each sample labelled ``worker``."""
    families: dict[str, Metric] = {}
    for worker, text in texts.items():
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for sample in family.samples:
                labels = {**sample.labels, "worker": worker}
                merged.samples.append(sample._replace(labels=labels))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)

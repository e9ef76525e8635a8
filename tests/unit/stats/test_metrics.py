"""Prometheus metrics in memory: counted per request, read from the table at scrape time,
by route, host, code, model and affinity outcome.
"""

from __future__ import annotations

import attrs
import prometheus_client
import pytest
from twisted.internet.task import Clock

from crossbar.polling.health import HealthTable
from crossbar.queueing.queue import FairQueue
from crossbar.stats.metrics import CONTENT_TYPE, Metrics
from crossbar.stats.record import RequestRecord
from tests.support.scrape import LAB_A_200, samples, value


@attrs.define
class FakeProxy:
    in_flight: dict[str, int] = attrs.Factory(dict)
    queue: FairQueue[object] = attrs.Factory(FairQueue)


@pytest.fixture
def table() -> HealthTable:
    return HealthTable({"gpu-a": "http://a", "gpu-b": "http://b"}, Clock())


def test_request_done_counts_by_route_host_and_code(table: HealthTable) -> None:
    metrics = Metrics(table, FakeProxy())
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 1.5, 0.2, 1000))
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 0.5, 0.1, 24))
    metrics.request_done(RequestRecord("lab", "gpu-a", 499, 7.0, 0.3, 10))
    metrics.request_done(RequestRecord("lab", None, 503, 0.001, None, 0))
    metrics.request_done(RequestRecord("-", None, 404, 0.001, None, 0))

    found = samples(metrics.render())
    assert value(found, "crossbar_requests_total", route="lab", host="gpu-a", code="200") == 2
    assert value(found, "crossbar_requests_total", route="lab", host="gpu-a", code="499") == 1
    assert value(found, "crossbar_requests_total", route="lab", host="-", code="503") == 1
    assert value(found, "crossbar_requests_total", route="-", host="-", code="404") == 1
    duration = "crossbar_request_duration_seconds"
    assert value(found, duration + "_count", route="lab", host="gpu-a") == 3
    assert value(found, duration + "_sum", route="lab", host="gpu-a") == 9.0
    assert value(found, duration + "_bucket", route="lab", host="gpu-a", le="1.0") == 1
    ttfb = "crossbar_time_to_first_byte_seconds"
    assert value(found, ttfb + "_count", route="lab", host="gpu-a") == 3
    assert value(found, ttfb + "_sum", route="lab", host="gpu-a") == pytest.approx(0.6)
    # no answer from any host: no time to first byte either
    assert value(found, ttfb + "_count", route="lab", host="-") == 0
    assert value(found, "crossbar_response_bytes_total", route="lab", host="gpu-a") == 1034


def test_fleet_metrics_are_read_at_scrape_time(table: HealthTable) -> None:
    proxy = FakeProxy({"gpu-a": 0, "gpu-b": 0})
    metrics = Metrics(table, proxy)
    found = samples(metrics.render())
    assert value(found, "crossbar_host_up", host="gpu-a") == 0
    assert value(found, "crossbar_polls_total", host="gpu-a") == 0

    table.record_ok("gpu-a", loaded=["m1"], known=["m1"])
    table.record_failure("gpu-b", "health: HTTP 500")
    table.record_failure("gpu-b", "health: HTTP 500")
    table.mark_down("gpu-b", "connection refused")  # not a poll
    proxy.in_flight["gpu-a"] = 3
    found = samples(metrics.render())
    assert value(found, "crossbar_host_up", host="gpu-a") == 1
    assert value(found, "crossbar_host_up", host="gpu-b") == 0
    assert value(found, "crossbar_polls_total", host="gpu-a") == 1
    assert value(found, "crossbar_polls_total", host="gpu-b") == 2
    assert value(found, "crossbar_poll_failures_total", host="gpu-a") == 0
    assert value(found, "crossbar_poll_failures_total", host="gpu-b") == 2
    assert value(found, "crossbar_in_flight_requests", host="gpu-a") == 3
    assert value(found, "crossbar_in_flight_requests", host="gpu-b") == 0


def test_each_crossbar_has_its_own_registry(table: HealthTable) -> None:
    one, two = Metrics(table, FakeProxy()), Metrics(table, FakeProxy())
    one.request_done(RequestRecord("lab", "gpu-a", 200, 0.1, 0.1, 1))
    assert value(samples(one.render()), "crossbar_requests_total", **LAB_A_200) == 1
    assert value(samples(two.render()), "crossbar_requests_total", **LAB_A_200) is None
    assert b"crossbar_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)
    assert CONTENT_TYPE == prometheus_client.CONTENT_TYPE_LATEST


# -- end to end ---------------------------------------------------------------------------------


def test_no_counter_has_a_created_twin(table: HealthTable) -> None:
    metrics = Metrics(table, FakeProxy())
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 1.5, 0.2, 1000, "m1"))
    text = metrics.render().decode()
    assert "crossbar_requests_total" in text and "_created" not in text


def test_requests_by_model_name_only_models_the_fleet_knows(table: HealthTable) -> None:
    """A client may name any model; the label is the model only when a host listed it,
    else ``other``, so a typo or a hostile client cannot grow the label set."""
    table.record_ok("gpu-a", loaded=["m1"], known=["m1", "m2"])
    table.record_ok("gpu-b", loaded=[], known=["m3"])
    metrics = Metrics(table, FakeProxy())
    for model in ["m1", "m2", "m3", "m1", "typo-1", "typo-2", None]:
        metrics.request_done(RequestRecord("lab", "gpu-a", 200, 0.1, 0.1, 1, model))
    found = samples(metrics.render())
    by_model = "crossbar_model_requests_total"
    assert value(found, by_model, route="lab", model="m1") == 2
    assert value(found, by_model, route="lab", model="m2") == 1
    assert value(found, by_model, route="lab", model="m3") == 1
    assert value(found, by_model, route="lab", model="(other)") == 2
    assert value(found, by_model, route="lab", model="typo-1") is None
    # Once a host lists it, a model has a label of its own.
    table.record_ok("gpu-b", loaded=[], known=["m3", "typo-1"])
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 0.1, 0.1, 1, "typo-1"))
    assert value(samples(metrics.render()), by_model, route="lab", model="typo-1") == 1


def test_a_host_s_model_named_other_is_not_the_bucket_of_unknown_models(
    table: HealthTable,
) -> None:
    table.record_ok("gpu-a", loaded=["other", "-"], known=["other", "-"])
    metrics = Metrics(table, FakeProxy())
    for model in ["other", "-", "typo", "typo-2", "-"]:
        metrics.request_done(RequestRecord("lab", "gpu-a", 200, 0.1, 0.1, 1, model))
    found = samples(metrics.render())
    by_model = "crossbar_model_requests_total"
    assert value(found, by_model, route="lab", model="other") == 1
    assert value(found, by_model, route="lab", model="-") == 2
    assert value(found, by_model, route="lab", model="(other)") == 2


def test_affinity_outcomes_are_counted_by_route_host_and_outcome(table: HealthTable) -> None:
    metrics = Metrics(table, FakeProxy())
    for host, outcome in [
        ("gpu-a", "new"),
        ("gpu-a", "home"),
        ("gpu-a", "home"),
        ("gpu-b", "moved"),
    ]:
        metrics.request_done(RequestRecord("lab", host, 200, 0.1, 0.1, 1, "m1", outcome))  # type: ignore[arg-type]
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 0.1, 0.1, 1, "m1"))  # no conversation
    found = samples(metrics.render())
    name = "crossbar_affinity_total"
    assert value(found, name, route="lab", host="gpu-a", outcome="new") == 1
    assert value(found, name, route="lab", host="gpu-a", outcome="home") == 2
    assert value(found, name, route="lab", host="gpu-b", outcome="moved") == 1
    assert sum(1 for sample in found if sample[0] == name) == 3


def test_a_duration_on_a_bucket_bound_counts_in_that_bucket(table: HealthTable) -> None:
    """Prometheus buckets are "less than or equal": 1 s exactly is in ``le="1.0"``, and
    a time past every bound only in ``+Inf``."""
    metrics = Metrics(table, FakeProxy())
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 1.0, 0.25, 1))
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 7200.0, 0.2500001, 1))
    found = samples(metrics.render())
    duration, ttfb = "crossbar_request_duration_seconds", "crossbar_time_to_first_byte_seconds"
    at = {"route": "lab", "host": "gpu-a"}
    assert value(found, duration + "_bucket", **at, le="0.5") == 0
    assert value(found, duration + "_bucket", **at, le="1.0") == 1
    assert value(found, duration + "_bucket", **at, le="1800.0") == 1
    assert value(found, duration + "_bucket", **at, le="+Inf") == 2
    assert value(found, duration + "_sum", **at) == 7201.0
    assert value(found, ttfb + "_bucket", **at, le="0.25") == 1
    assert value(found, ttfb + "_bucket", **at, le="0.5") == 2


def test_loads_requests_made_are_counted_by_key(table: HealthTable) -> None:
    """A request that made its host load the model counts once for its key, even with no
    tokens reported (its host failed); one sent where the model was loaded does not."""
    table.record_ok("gpu-a", loaded=["m1"], known=["m1", "m2"])
    metrics = Metrics(table, FakeProxy())
    made = RequestRecord("lab", "gpu-a", 500, 9.0, model="m2", key="alice", loads=1)
    metrics.request_done(made)
    metrics.request_done(RequestRecord("lab", "gpu-a", 200, 0.1, model="m1", key="bob"))
    found = samples(metrics.render())
    loads = "crossbar_key_model_loads_total"
    assert value(found, loads, route="lab", host="gpu-a", model="m2", key="alice") == 1
    assert value(found, loads, route="lab", host="gpu-a", model="m1", key="bob") is None

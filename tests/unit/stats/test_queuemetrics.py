"""crossbar.stats.queuemetrics: what waits in crossbar, as the metrics and the status pages
show it."""

from __future__ import annotations

from crossbar.queueing.queue import Flow
from crossbar.queueing.traffic import Traffic
from crossbar.stats.queuemetrics import QueueCollector, waiting_by_route


def test_waiting_is_summed_per_route_with_its_oldest_wait() -> None:
    traffic = Traffic(["gpu-a"], ["lab", "code"])
    queue = traffic.queue
    queue.push(("lab", "m1"), Flow("alice"), object(), now=10.0)
    queue.push(("lab", "m2"), Flow("bob"), object(), now=12.0)
    queue.push(("code", None), Flow("10.0.0.9"), object(), now=14.0)
    assert waiting_by_route(traffic, now=20.0) == {
        "lab": {"requests": 2, "oldest_seconds": 10.0},
        "code": {"requests": 1, "oldest_seconds": 6.0},
    }


def test_the_collector_names_routes_and_the_flows_that_used_the_slots() -> None:
    traffic = Traffic(["gpu-a"], ["lab"])
    queue = traffic.queue
    queue.push(("lab", "m1"), Flow("alice"), object(), now=100.0)
    for name, seconds in (("alice", 30.0), ("bob", 10.0), ("tiny", 0.01)):
        queue.started(Flow(name), now=100.0)
        queue.finished(Flow(name), seconds, now=100.0)
    families = {f.name: f for f in QueueCollector(traffic, lambda: 104.0).collect()}
    [waiting] = families["crossbar_waiting_requests"].samples
    assert (waiting.labels, waiting.value) == ({"route": "lab"}, 1)
    shares = {s.labels["flow"]: s.value for s in families["crossbar_slot_share"].samples}
    assert shares == {"alice": 0.7498, "bob": 0.2499}  # under 1%: left out

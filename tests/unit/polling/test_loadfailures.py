"""crossbar.polling.loadfailures: a model a host failed to load is remembered, backed off
longer at each failure in a row, shown in the host's health, and skipped by placement and
spillover meanwhile (audit 3, finding 4)."""

from __future__ import annotations

import json

from twisted.internet.task import Clock

from crossbar.polling.health import HealthTable, HostState
from crossbar.polling.loadfailures import (
    FIRST_BACKOFF,
    MOST_BACKOFF,
    MOST_MODELS,
    LoadFailures,
    failed_load,
)
from crossbar.routing.placement import FAILED, FREE, Occupancy, cheapest, spill_places

ROUTER_500 = json.dumps(
    {"error": {"code": 500, "message": "model name=tiny-a failed to load", "type": "server_error"}}
).encode()


def test_a_router_s_failed_load_is_told_from_other_errors() -> None:
    assert failed_load(500, ROUTER_500)
    assert not failed_load(500, b'{"error": "out of memory"}')
    assert not failed_load(503, ROUTER_500)
    assert not failed_load(500, b"x" * 5000 + b"failed to load")  # only the start is read


def test_each_failure_in_a_row_doubles_the_back_off_up_to_a_ceiling() -> None:
    failures, now, waits = LoadFailures(), 0.0, []
    for _ in range(8):
        failures = failures.failed("m", now)
        assert failures.backed_off("m", now) and not failures.backed_off("other", now)
        waits.append(failures.models["m"].until - now)
        now = failures.models["m"].until  # tried again once it may be
        assert not failures.backed_off("m", now)
    assert waits == [FIRST_BACKOFF * 2**i for i in range(5)] + [MOST_BACKOFF] * 3
    assert failures.total == 8
    seen = failures.cleared(["m"])
    assert not seen.models and seen.total == 8  # forgotten once loaded; still counted


def test_made_up_model_names_cannot_grow_it() -> None:
    failures = LoadFailures()
    for i in range(MOST_MODELS * 3):
        failures = failures.failed(f"m{i}", 0.0)
    assert len(failures.models) == MOST_MODELS and failures.total == MOST_MODELS * 3


def test_the_host_s_health_counts_and_shows_it_until_a_poll_lists_the_model_loaded() -> None:
    clock = Clock()
    clock.advance(1000)
    table = HealthTable({"gpu-a": "http://a"}, clock)
    table.record_ok("gpu-a", loaded=["b"], known=["a", "b"])
    table.load_failed("gpu-a", "a")
    table.load_failed("gpu-a", "a")
    state = table.view["gpu-a"]
    assert state.healthy  # a failed load is no failure of the host
    clock.advance(10)
    assert state.to_json(clock.seconds())["failed_loads"] == {
        "total": 2,
        "backed_off": {"a": {"failures": 2, "backed_off_seconds": 50}},
    }
    assert state.load_failures.said(clock.seconds()) == "a failed to load (2x), not tried for 50 s"
    table.record_ok("gpu-a", loaded=["a", "b"], known=["a", "b"])
    after = table.view["gpu-a"]
    assert not after.load_failures.backed_off("a", clock.seconds())
    assert after.to_json(clock.seconds())["failed_loads"] == {"total": 2, "backed_off": {}}
    assert "failed_loads" not in HostState("x", "http://x").to_json(clock.seconds())


def router(name: str, loaded: tuple[str, ...], **more: object) -> HostState:
    return HostState(name, f"http://{name}", True, loaded, ("a", "b", "c"), **more)  # type: ignore[arg-type]


def test_spillover_skips_a_host_that_failed_to_load_the_model_while_backed_off() -> None:
    """Audit 3, finding 4: 5 of 5 spilled requests got ``500 ... failed to load``."""
    failing = LoadFailures().failed("a", 100.0)
    hosts = [
        router("h0", ("a",), slots={"a": 1}, max_instances=2),
        router("h1", ("b",), max_instances=2, load_failures=failing),
    ]
    full = Occupancy({("h0", "a"): 1})
    assert spill_places(hosts, "a", full, 110.0) == []  # the request waits for h0
    later = 100.0 + FIRST_BACKOFF
    assert [x.host for x in spill_places(hosts, "a", full, later)] == ["h1"]  # tried again


def test_placement_takes_another_host_while_one_is_backed_off_for_the_model() -> None:
    failing = LoadFailures().failed("c", 0.0)
    group = [
        router("h0", ("a",), max_instances=2, load_failures=failing),
        router("h1", ("a", "b"), max_instances=2),
    ]
    (load,) = cheapest(group, "c", Occupancy(busy={("h1", "a"): 1}), 1.0) or []
    assert (load.host, load.rank) != ("h0", FREE) and load.host == "h1"
    # Rooms unknown: placement said nothing before; now it leaves the failing host out.
    unknown = [router("h0", (), load_failures=failing), router("h1", ())]
    assert [x.host for x in cheapest(unknown, "c", Occupancy(), 1.0) or []] == ["h1"]
    # Only failing hosts: they are what is left (their answer says why).
    only = [router("h0", (), load_failures=failing)]
    assert [x.rank for x in cheapest(only, "c", Occupancy(), 1.0) or []] == [FAILED]

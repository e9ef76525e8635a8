"""crossbar.routing.placement: where a model loaded on no healthy host of a group is loaded."""

from __future__ import annotations

import json
import math

import pytest_twisted
from twisted.internet.defer import Deferred

from crossbar.polling.health import HostState
from crossbar.routing.placement import (
    BUSY,
    EVICTS,
    FREE,
    LOADING,
    NO_AUTOLOAD,
    RECENT,
    UNKNOWN,
    Occupancy,
    cheapest,
    rank,
    spill_places,
)
from crossbar.testing import SimulatedHost
from crossbar.testing.rig import rigs

KNOWN = ("a", "b", "c", "d")


def host(
    name: str, loaded: tuple[str, ...] = (), room: int | None = 2, **more: object
) -> HostState:
    return HostState(
        name,
        f"http://{name}",
        True,
        loaded,
        KNOWN,
        max_instances=room,
        **more,  # type: ignore[arg-type]
    )


def hosts_of(loads: list | None) -> list[str] | None:  # type: ignore[type-arg]
    return None if loads is None else [load.host for load in loads]


def test_a_host_with_a_free_instance_comes_first() -> None:
    group = [host("h0", ("a", "b")), host("h1", ("c",)), host("h2", ())]
    loads = cheapest(group, "d", Occupancy(), 100.0)
    assert hosts_of(loads) == ["h1", "h2"]  # both have room: the policy breaks the tie
    assert loads is not None and loads[0].rank == FREE and loads[0].free == 1


def test_else_the_host_whose_idle_victim_has_been_idle_longest() -> None:
    group = [host("h0", ("a", "b")), host("h1", ("c", "d"))]
    usage = Occupancy(last_used={("h0", "a"): 90.0, ("h0", "b"): 80.0, ("h1", "c"): 50.0,
                             ("h1", "d"): 95.0})  # fmt: skip
    loads = cheapest(group, "e", usage, 100.0)
    assert loads is not None and len(loads) == 1
    (load,) = loads
    assert (load.host, load.rank, load.evicts, load.idle) == ("h1", EVICTS, "c", 50.0)
    assert load.to_json() == {
        "host": "h1",
        "why": "evicts idle model",
        "evicts": "c",
        "evicts_idle_seconds": 50,
        "instances": 2,
        "free": 0,
    }


def test_never_a_host_whose_models_are_all_busy_while_another_has_an_idle_one() -> None:
    group = [host("h0", ("a", "b")), host("h1", ("c", "d"))]
    usage = Occupancy(busy={("h0", "a"): 1, ("h0", "b"): 2, ("h1", "c"): 1})
    assert hosts_of(cheapest(group, "e", usage, 100.0)) == ["h1"]
    assert rank(group[0], "e", usage, 100.0).rank == BUSY
    evicts = rank(group[1], "e", usage, 100.0)
    assert (evicts.evicts, evicts.idle) == ("d", math.inf)  # never used through crossbar


def test_a_model_being_loaded_somewhere_waits_for_that_load() -> None:
    group = [host("h0", ()), host("h1", ("a",), loading=("b",))]
    assert hosts_of(cheapest(group, "b", Occupancy(), 0.0)) == ["h1"]
    assert rank(group[1], "b", Occupancy(), 0.0).rank == LOADING
    # crossbar's own request for it in flight there counts as a load too
    usage = Occupancy(busy={("h0", "c"): 1})
    assert hosts_of(cheapest([host("h1", ("a", "b")), host("h0", ())], "c", usage, 0.0)) == ["h0"]


def test_requests_in_flight_for_a_model_not_listed_take_an_instance() -> None:
    h = host("h0", ("a",))
    assert rank(h, "c", Occupancy(busy={("h0", "b"): 1}), 0.0).rank == EVICTS
    assert (
        rank(h, "c", Occupancy(busy={("h0", "zzz"): 1}), 0.0).rank == FREE
    )  # not a model it knows


def test_no_room_known_anywhere_leaves_the_choice_to_the_policy() -> None:
    group = [host("h0", ("a",), room=None), host("h1", (), room=None)]
    assert cheapest(group, "b", Occupancy(), 0.0) is None
    assert cheapest([host("h0", ("a",))], None, Occupancy(), 0.0) is None
    assert cheapest([host("h0", ("a",)), host("h1")], "a", Occupancy(), 0.0) is None  # loaded


def test_unknown_rooms_rank_after_known_ones_and_before_busy_ones() -> None:
    busy = Occupancy(busy={("h0", "a"): 1, ("h0", "b"): 1})
    group = [host("h0", ("a", "b")), host("h1", ("c",), room=None)]
    assert hosts_of(cheapest(group, "d", busy, 0.0)) == ["h1"]
    assert rank(group[1], "d", busy, 0.0).rank == UNKNOWN
    assert hosts_of(cheapest([*group, host("h2", ("c",))], "d", busy, 0.0)) == ["h2"]


def test_a_router_that_does_not_autoload_comes_last() -> None:
    group = [host("h0", (), autoload=False), host("h1", ("a", "b"))]
    busy = Occupancy(busy={("h1", "a"): 1, ("h1", "b"): 1})
    assert rank(group[0], "c", busy, 0.0).rank == NO_AUTOLOAD
    assert hosts_of(cheapest(group, "c", busy, 0.0)) == ["h1"]


# -- through a running crossbar, in front of two simulated routers --------------------------------


@pytest_twisted.ensureDeferred
async def test_a_model_loaded_nowhere_loads_on_the_free_router_once() -> None:
    """The issue's fleet: two routers of one instance each, A loaded on the first. Under
    ``priority`` B used to evict A on the first; now it loads on the second, and requests
    for it while it loads wait for that one load."""
    first = SimulatedHost({"A": "loaded", "B": "unloaded"}, models_max=1, load_time=0.3)
    second = SimulatedHost({"A": "unloaded", "B": "unloaded"}, models_max=1, load_time=0.3)
    async with rigs() as make:
        rig = await make({"h0": first, "h1": second})
        assert rig.state("h0").max_instances == 1
        asks = [rig.post("/lab/v1/chat/completions", {"model": "B"}) for _ in range(3)]
        answers = [Deferred.fromCoroutine(ask) for ask in asks]  # all three at once
        done = [await answer for answer in answers]
        assert [r.headers.getRawHeaders("x-crossbar-host") for r, _ in done] == [["h1"]] * 3
        assert second.loads == {"B": 1} and first.loads == {} and first.status("A") == "loaded"
        response, _ = await rig.post("/lab/v1/chat/completions", {"model": "A"})
        assert response.headers.getRawHeaders("x-crossbar-host") == ["h0"]


# -- spillover: one more copy when every host with the model has all its slots busy -------------


def test_one_more_copy_starts_only_when_every_copy_is_full() -> None:
    from crossbar.routing.placement import spill_places

    full = {("h0", "a"): 2}
    hosts = [host("h0", ("a",), slots={"a": 2}), host("h1", ("b",)), host("h2", ("b", "c"))]
    assert hosts_of(spill_places(hosts, "a", Occupancy(full), 0.0)) == ["h1"]  # a free instance
    assert spill_places(hosts, "a", Occupancy({("h0", "a"): 1}), 0.0) == []  # a slot is free
    slots_unknown = [host("h0", ("a",)), *hosts[1:]]
    assert spill_places(slots_unknown, "a", Occupancy(full), 0.0) == []  # never full: unknown


def test_a_spill_never_evicts_a_busy_model_and_starts_one_load_at_a_time() -> None:
    from crossbar.routing.placement import spill_places

    hosts = [host("h0", ("a",), slots={"a": 1}), host("h1", ("b", "c"))]
    busy = Occupancy({("h0", "a"): 1, ("h1", "b"): 1, ("h1", "c"): 1})
    assert spill_places(hosts, "a", busy, 0.0) == []
    idle_c = Occupancy({("h0", "a"): 1, ("h1", "b"): 1})
    (load,) = spill_places(hosts, "a", idle_c, 0.0)
    assert (load.host, load.evicts) == ("h1", "c")
    loading = [*hosts, host("h2", (), loading=("a",))]
    assert spill_places(loading, "a", idle_c, 0.0) == []  # one load of it runs already
    configured = Occupancy({("h0", "a"): 3}, slots={"h0": 3})  # slots: in the config counts
    assert hosts_of(spill_places([host("h0", ("a",)), host("h1")], "a", configured, 0.0)) == ["h1"]


@pytest_twisted.ensureDeferred
async def test_requests_for_a_b_a_b_cause_two_loads_not_four() -> None:
    """Two routers of one instance each, C and D loaded nowhere, asked C, D, C, D at once:
    C loads on the first, D on the second (the first's only instance is taken by C's
    load), and each later request joins its model's load."""
    first = SimulatedHost({"C": "unloaded", "D": "unloaded"}, models_max=1, load_time=0.3)
    second = SimulatedHost({"C": "unloaded", "D": "unloaded"}, models_max=1, load_time=0.3)
    async with rigs() as make:
        rig = await make({"h0": first, "h1": second})
        asks = [rig.post("/lab/v1/chat/completions", {"model": m}) for m in "CDCD"]
        answers = [Deferred.fromCoroutine(ask) for ask in asks]
        done = [await answer for answer in answers]
        hosts = [r.headers.getRawHeaders("x-crossbar-host") for r, _ in done]
        # Which of C and D reaches crossbar first is the sockets' to say: either way,
        # each model loads once, on a host of its own, and its other request joins it.
        went = {
            model: {h[0] for h, m in zip(hosts, "CDCD", strict=True) if m == model}
            for model in "CD"
        }
        assert sorted(map(len, went.values())) == [1, 1] and went["C"] != went["D"]
        loaded = {"h0": first.loads, "h1": second.loads}
        assert loaded == {went["C"].pop(): {"C": 1}, went["D"].pop(): {"D": 1}}
        assert first.evictions == second.evictions == {}


@pytest_twisted.ensureDeferred
async def test_the_status_says_where_a_model_would_load_and_each_router_s_room() -> None:
    from crossbar.config import RouteConfig

    first = SimulatedHost({"A": "loaded", "B": "unloaded"}, models_max=1)
    second = SimulatedHost({"A": "unloaded", "B": "unloaded"}, models_max=1)
    routes = {"lab": RouteConfig("lab", ("h0", "h1"), "B")}
    async with rigs() as make:
        rig = await make({"h0": first, "h1": second}, routes)
        _, body = await rig.get("/_crossbar/status")
        status = json.loads(body)
        assert status["routes"]["lab"]["choice"] == "h1"
        assert status["routes"]["lab"]["load"] == {
            "host": "h1",
            "why": "free instance",
            "instances": 1,
            "free": 1,
        }
        h0 = status["hosts"]["h0"]
        assert (h0["max_instances"], h0["instances"]) == (1, {"used": 1, "max": 1})
        assert h0["models"] == {"A": {"in_flight": 0, "idle_seconds": None, "window": 4096}}
        _, page = await rig.get("/_crossbar/")
        assert b"would load B: 1 of 1 instances free" in page
        assert b"1 of 1 instances" in page and b"unused since crossbar started" in page


# -- a model used lately is never evicted for another's load (audit 3, finding 9) ----------


def test_a_model_used_within_min_idle_is_never_the_one_evicted() -> None:
    """The agent's model on h0 was used 5 s ago (it is thinking); h1's was used 40 s ago."""
    group = [host("h0", ("a", "b")), host("h1", ("c", "d"))]
    usage = Occupancy(busy={("h0", "b"): 1, ("h1", "d"): 1},
                      last_used={("h0", "a"): 95.0, ("h1", "c"): 60.0})  # fmt: skip
    assert rank(group[0], "e", usage, 100.0, min_idle=30.0).rank == RECENT
    loads = cheapest(group, "e", usage, 100.0, min_idle=30.0)
    assert loads is not None and [(x.host, x.evicts) for x in loads] == [("h1", "c")]
    # Both used lately: neither evicts, and the status says why.
    lately = Occupancy(usage.busy, {("h0", "a"): 95.0, ("h1", "c"): 90.0})
    loads = cheapest(group, "e", lately, 100.0, min_idle=30.0)
    assert loads is not None and {x.rank for x in loads} == {RECENT}
    assert loads[0].to_json()["why"] == "idle models used lately"
    # A spill never evicts one.
    spill = [host("h9", ("e",), slots={"e": 1}), *group]
    full = Occupancy({**lately.busy, ("h9", "e"): 1}, lately.last_used)
    assert spill_places(spill, "e", full, 100.0, min_idle=30.0) == []
    assert hosts_of(spill_places(spill, "e", full, 100.0)) == ["h0", "h1"]  # min_idle 0: as before


def test_the_route_s_min_idle_before_evict_is_what_the_policy_uses() -> None:
    from crossbar.config import RouteConfig
    from crossbar.routing.policies import Ask, Policies

    # h0 would evict model a, used 5 s ago; h1's room is unknown.
    group = [host("h0", ("a",), room=1), host("h1", ("c",), room=None)]
    usage = Occupancy(last_used={("h0", "a"): 95.0})
    policies = Policies(["lab"], {}, usage)
    states = {s.name: s for s in group}
    route = RouteConfig("lab", ("h0", "h1"), None)  # min_idle_before_evict: 30 s
    choice = policies.of(route).choose(route, Ask("e", now=100.0), states, {})
    assert choice is not None and choice.host == "h1"
    eager = RouteConfig("lab", ("h0", "h1"), None, min_idle_before_evict=0.0)
    choice = policies.of(eager).choose(eager, Ask("e", now=100.0), states, {})
    assert choice is not None and choice.host == "h0"  # evicts a, as before

"""crossbar.routing.groups and the policies of crossbar.routing.policies: which host serves a
request, and which routes have none. Pure rules over hand-made host states; each policy
asked as the pages ask it (its state does not move;
tests/unit/routing/test_policies.py moves it)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import attrs
import pytest

from crossbar.config import Policy, RouteConfig, WhenAllDown
from crossbar.polling.health import HostState
from crossbar.routing.affinity import Conversations, Placement
from crossbar.routing.groups import no_healthy_host, routes_down, served_model
from crossbar.routing.policies import REGISTRY, Ask, CacheAffinity, Conversation, RoundRobin
from crossbar.routing.rendezvous import rendezvous


def state(
    name: str, healthy: bool = True, loaded: tuple[str, ...] = (), known: tuple[str, ...] = ()
) -> HostState:
    return HostState(
        name=name, url=f"http://{name}", healthy=healthy, loaded=loaded, known=known + loaded
    )


def route(
    *hosts: str, policy: Policy = "priority", when_all_down: WhenAllDown = "fail"
) -> RouteConfig:
    return RouteConfig(
        name="r", hosts=hosts, default_model=None, policy=policy, when_all_down=when_all_down
    )


def choose_for_route(
    config: RouteConfig,
    model: str | None,
    states: Mapping[str, HostState],
    in_flight: Mapping[str, int],
    turn: int,
    exclude: Collection[str] = (),
) -> str | None:
    """The route's policy's answer, its round-robin turn at ``turn``."""
    policy = REGISTRY[config.policy].make([config.name], {})
    if isinstance(policy, RoundRobin):
        policy.turns[config.name] = turn
    ask = Ask(model, exclude=tuple(exclude))
    choice = policy.choose(config, ask, states, in_flight, commit=False)
    return None if choice is None else choice.host


def choose(
    hosts: Sequence[str],
    model: str | None,
    states: Mapping[str, HostState],
    *,
    policy: Policy = "priority",
    in_flight: Mapping[str, int] | None = None,
    turn: int = 0,
    exclude: Collection[str] = (),
) -> str | None:
    config = RouteConfig(name="r", hosts=tuple(hosts), default_model=None, policy=policy)
    return choose_for_route(config, model, states, in_flight or {}, turn, exclude)


def place(
    config: RouteConfig,
    model: str | None,
    states: Mapping[str, HostState],
    in_flight: Mapping[str, int],
    table: Conversations,
    key: bytes,
    now: float,
    exclude: Sequence[str] = (),
    turn: int | None = None,
) -> Placement | None:
    policy = CacheAffinity()
    policy.conversations = table
    conversation = Conversation(key, turn)
    ask = Ask(model, conversation, exclude, now)
    return policy.place(config, ask, conversation, states, in_flight)


def test_choice_prefers_loaded_then_known_then_healthy() -> None:
    states = {
        "a": state("a", known=("m1", "m2")),
        "b": state("b", loaded=("m2",)),
        "c": state("c", healthy=False, loaded=("m1", "m3")),
        "d": state("d", known=("m4",)),
    }
    order = ["a", "b", "c", "d"]
    assert choose(order, "m2", states) == "b"  # loaded wins over earlier host that only knows it
    assert choose(order, "m1", states) == "a"  # c has it loaded but is down; a knows it
    assert choose(order, "m4", states) == "d"  # only d knows it
    assert choose(order, "m9", states) == "a"  # nobody knows it: first healthy
    assert choose(order, None, states) == "a"
    assert choose(["c"], "m1", states) is None
    assert choose(["b", "a"], "m1", states) == "a"
    assert choose(["b", "a"], "m9", states) == "b"  # order of the route decides


def test_host_without_a_state_is_never_chosen() -> None:
    states = {"b": state("b")}
    assert choose(["ghost", "b"], None, states) == "b"
    assert choose(["ghost"], None, states) is None


# -- policies ---------------------------------------------------------------------------------


def test_priority_takes_the_first_of_the_best_group_whatever_the_turn() -> None:
    states = {"a": state("a"), "b": state("b", loaded=("m",)), "c": state("c", loaded=("m",))}
    for turn in range(4):
        assert choose(["a", "b", "c"], "m", states, policy="priority", turn=turn) == "b"
    assert choose(["c", "b", "a"], None, states, policy="priority", turn=1) == "c"


def test_round_robin_takes_the_turn_th_healthy_host() -> None:
    states = {"a": state("a"), "b": state("b", healthy=False), "c": state("c"), "d": state("d")}
    picks = [
        choose(["a", "b", "c", "d"], None, states, policy="round_robin", turn=t) for t in range(7)
    ]
    assert picks == ["a", "c", "d", "a", "c", "d", "a"]


def test_round_robin_turns_within_the_group_that_has_the_model_loaded() -> None:
    states = {
        "a": state("a", known=("m",)),
        "b": state("b", loaded=("m",)),
        "c": state("c"),
        "d": state("d", loaded=("m",)),
    }
    picks = [
        choose(["a", "b", "c", "d"], "m", states, policy="round_robin", turn=t) for t in range(4)
    ]
    assert picks == ["b", "d", "b", "d"]


def test_least_busy_takes_the_host_with_fewest_in_flight() -> None:
    states = {"a": state("a"), "b": state("b"), "c": state("c")}
    in_flight = {"a": 3, "b": 1, "c": 2}
    assert choose(["a", "b", "c"], None, states, policy="least_busy", in_flight=in_flight) == "b"


def test_least_busy_ties_go_to_route_order() -> None:
    states = {"a": state("a"), "b": state("b"), "c": state("c")}
    in_flight = {"a": 2, "b": 1, "c": 1}
    assert choose(["a", "b", "c"], None, states, policy="least_busy", in_flight=in_flight) == "b"
    assert choose(["a", "c", "b"], None, states, policy="least_busy", in_flight=in_flight) == "c"
    # A host missing from the counters carries nothing.
    with_x = {**states, "x": state("x")}
    assert choose(["a", "b", "x"], None, with_x, policy="least_busy", in_flight=in_flight) == "x"


def test_least_busy_stays_within_the_best_group_and_skips_down_hosts() -> None:
    states = {
        "a": state("a", loaded=("m",)),
        "b": state("b"),
        "c": state("c", healthy=False, loaded=("m",)),
    }
    in_flight = {"a": 5, "b": 0, "c": 0}
    assert choose(["a", "b", "c"], "m", states, policy="least_busy", in_flight=in_flight) == "a"
    assert choose(["a", "b", "c"], None, states, policy="least_busy", in_flight=in_flight) == "b"


def test_least_busy_without_counters_is_priority() -> None:
    states = {"a": state("a"), "b": state("b")}
    assert choose(["b", "a"], None, states, policy="least_busy") == "b"


# -- exclude ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["priority", "round_robin", "least_busy"])
def test_excluded_hosts_are_never_chosen(policy: Policy) -> None:
    states = {"a": state("a", loaded=("m",)), "b": state("b"), "c": state("c")}
    in_flight = {"a": 0, "b": 4, "c": 9}
    picks = {
        choose(
            ["a", "b", "c"],
            "m",
            states,
            policy=policy,
            in_flight=in_flight,
            turn=t,
            exclude={"a", "c"},
        )
        for t in range(3)
    }
    assert picks == {"b"}
    assert choose(["a", "b", "c"], "m", states, policy=policy, exclude=("a", "b", "c")) is None


# -- choose_for_route -------------------------------------------------------------------------


def test_choose_for_route_uses_the_route_policy() -> None:
    states = {"a": state("a"), "b": state("b"), "c": state("c")}
    in_flight = {"a": 2, "b": 0, "c": 1}
    assert choose_for_route(route("a", "b", "c"), None, states, in_flight, turn=2) == "a"
    assert (
        choose_for_route(route("a", "b", "c", policy="round_robin"), None, states, in_flight, 2)
        == "c"
    )
    assert (
        choose_for_route(route("a", "b", "c", policy="least_busy"), None, states, in_flight, 2)
        == "b"
    )


def test_all_down_fails_by_default() -> None:
    states = {"a": state("a", healthy=False), "b": state("b", healthy=False)}
    assert choose_for_route(route("a", "b"), None, states, {}, 0) is None


def test_all_down_with_try_all_gives_the_next_untried_host() -> None:
    states = {"a": state("a", healthy=False), "b": state("b", healthy=False)}
    states["c"] = state("c", healthy=False)
    config = route("a", "b", "c", when_all_down="try_all")
    assert choose_for_route(config, "m", states, {}, 0) == "a"
    assert choose_for_route(config, "m", states, {}, 0, exclude={"a"}) == "b"
    assert choose_for_route(config, "m", states, {}, 0, exclude={"a", "b"}) == "c"


def test_try_all_never_gives_a_host_gone_from_the_table() -> None:
    """A request that began before a reload removed a host retries only hosts still known."""
    states = {"a": state("a", healthy=False)}
    config = route("a", "gone", when_all_down="try_all")
    assert choose_for_route(config, "m", states, {}, 0, exclude={"a"}) is None
    assert choose_for_route(config, "m", states, {}, 0, exclude={"a", "b", "c"}) is None


def test_try_all_still_prefers_a_healthy_host() -> None:
    states = {"a": state("a", healthy=False), "b": state("b")}
    config = route("a", "b", when_all_down="try_all")
    assert choose_for_route(config, None, states, {}, 0) == "b"
    # b was tried and failed: with no healthy host left, a is tried although it is down.
    assert choose_for_route(config, None, states, {}, 0, exclude={"b"}) == "a"


# -- routes_down ------------------------------------------------------------------------------


def test_routes_down_lists_routes_without_a_healthy_host_in_config_order() -> None:
    states = {"a": state("a", healthy=False), "b": state("b"), "c": state("c", healthy=False)}
    routes = {
        "zeta": route("c"),
        "mixed": route("a", "b"),
        "ghost": route("nobody"),
        "alpha": route("a", "c", when_all_down="try_all"),
    }
    assert routes_down(routes, states) == ["zeta", "ghost", "alpha"]
    assert routes_down({"mixed": routes["mixed"]}, states) == []


def test_a_slot_counts_against_the_model_the_host_runs_whatever_name_was_sent() -> None:
    one = state("one", loaded=("tiny-a.gguf",))
    router = state("router", loaded=("x",), known=("y",))
    assert served_model(route("one"), "m0", {"one": one}) == "tiny-a.gguf"
    assert served_model(route("one"), None, {"one": one}) == "tiny-a.gguf"
    assert served_model(route("router", "one"), "y", {"router": router, "one": one}) == "y"
    assert served_model(route("router"), "m0", {"router": router}) == "m0"  # refused there
    down = {"one": state("one", healthy=False, loaded=("tiny-a.gguf",))}
    assert served_model(route("one"), "m0", down) == "m0"


def test_the_503_names_each_host_and_why_it_is_out() -> None:
    """A host that failed this request is said to have, apart from one that is down."""
    down = attrs.evolve(state("a", healthy=False), polled=True, last_err="models: HTTP 404")
    states = {"a": down, "b": state("b"), "c": state("c")}
    words = no_healthy_host("lab", ("a", "b", "c"), states, ["b"], small=["c"])
    assert words == (
        "no healthy host for route lab: a down (models: HTTP 404), b failed this request,"
        " c window too small for this prompt"
    )


# -- cache_affinity ---------------------------------------------------------------------------

KEYS = [bytes([n]) * 16 for n in range(40)]


def test_cache_affinity_without_a_conversation_takes_the_least_busy() -> None:
    states = {"a": state("a"), "b": state("b"), "c": state("c")}
    busy = {"a": 3, "b": 1, "c": 2}
    assert choose(["a", "b", "c"], None, states, policy="cache_affinity", in_flight=busy) == "b"
    r = route("a", "b", "c", policy="cache_affinity")
    assert choose_for_route(r, None, states, busy, 0) == "b"


def test_a_conversation_is_placed_within_the_group_that_has_its_model_loaded() -> None:
    states = {"a": state("a"), "b": state("b", loaded=("m",)), "c": state("c", loaded=("m",))}
    r = route("a", "b", "c", policy="cache_affinity")
    table = Conversations()
    homes = set()
    for key in KEYS:
        placed = place(r, "m", states, {}, table, key, 0.0)
        assert placed is not None and placed.host == rendezvous(key, ["b", "c"])[0]
        homes.add(placed.host)
    assert homes == {"b", "c"}  # a knows nothing of m: never chosen while b or c has it


def test_a_retry_of_a_conversation_goes_to_its_next_host() -> None:
    states = {"a": state("a"), "b": state("b"), "c": state("c", healthy=False)}
    r = route("a", "b", "c", policy="cache_affinity")
    table = Conversations()
    key = KEYS[0]
    first = place(r, None, states, {}, table, key, 0.0)
    assert first is not None
    retry = place(r, None, states, {}, table, key, 0.0, exclude=[first.host])
    assert retry is not None and retry.host != first.host and retry.outcome == "moved"
    assert place(r, None, states, {}, table, key, 0.0, exclude=["a", "b"]) is None


def test_a_retry_past_the_loaded_group_goes_to_the_next_group() -> None:
    states = {"a": state("a", loaded=("m",)), "b": state("b", known=("m",))}
    r = route("a", "b", policy="cache_affinity")
    placed = place(r, "m", states, {}, Conversations(), KEYS[0], 0.0, exclude=["a"])
    assert placed is not None and placed.host == "b"


def test_no_healthy_host_leaves_a_conversation_to_when_all_down() -> None:
    states = {"a": state("a", healthy=False)}
    r = route("a", policy="cache_affinity", when_all_down="try_all")
    assert place(r, None, states, {}, Conversations(), KEYS[0], 0.0) is None
    assert choose_for_route(r, None, states, {}, 0) == "a"


def test_a_503_names_each_host_of_the_route_and_why_it_is_out() -> None:
    states = {
        "gpu-a": HostState("gpu-a", "http://a", polled=True, last_err="models: HTTP 404"),
        "gpu-b": HostState("gpu-b", "http://b", polled=True, healthy=True),
        "gpu-c": HostState("gpu-c", "http://c", polled=True, healthy=True),
        "gpu-d": HostState("gpu-d", "http://d"),
        "gpu-e": HostState("gpu-e", "http://e", polled=True, last_err="x" * 500),
    }
    words = no_healthy_host(
        "r", ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"], states, tried=["gpu-b"], full=["gpu-c"]
    )
    assert words == (
        "no healthy host for route r: gpu-a down (models: HTTP 404), gpu-b failed this request,"
        f" gpu-c every slot busy, gpu-d not polled yet, gpu-e down ({'x' * 117}...)"
    )
    assert (
        no_healthy_host("r", ["gpu-f"], {}) == "no healthy host for route r: gpu-f not polled yet"
    )

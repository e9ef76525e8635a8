"""crossbar.routing.policies: each policy an object with its own state, in one registry.
The pages ask as the proxy asks, with ``commit=False``: the same answer, no state moved."""

from __future__ import annotations

from crossbar.config import POLICIES, RouteConfig
from crossbar.polling.health import HostState
from crossbar.routing.policies import (
    REGISTRY,
    Ask,
    CacheAffinity,
    Conversation,
    Policies,
    RoundRobin,
    places_conversations,
)

STATES = {n: HostState(name=n, url=f"http://{n}", healthy=True) for n in ("a", "b", "c")}


def route(policy: str, name: str = "lab") -> RouteConfig:
    return RouteConfig(name=name, hosts=("a", "b", "c"), default_model=None, policy=policy)  # type: ignore[arg-type]


def test_every_policy_the_config_allows_is_in_the_registry() -> None:
    assert tuple(REGISTRY) == POLICIES
    policies = Policies(["lab"])
    for name in POLICIES:
        assert policies.of(route(name)).name == name


def test_round_robin_moves_its_turn_only_for_a_request_s_first_try() -> None:
    policies = Policies(["lab", "other"])
    lab = route("round_robin")
    policy = policies.of(lab)
    said = [policy.choose(lab, Ask(None), STATES, {}, commit=False) for _ in range(3)]
    assert {c.host for c in said if c} == {"a"}  # asking, as the pages do, moves nothing
    went = [policy.choose(lab, Ask(None), STATES, {}) for _ in range(4)]
    assert [c.host for c in went if c] == ["a", "b", "c", "a"]
    retry = policy.choose(lab, Ask(None, exclude=("b",)), STATES, {})  # a failover
    assert retry is not None and retry.host != "b"
    assert policy.choose(lab, Ask(None), STATES, {}) == went[1]  # the retry took no turn
    # each route has its own turn
    other = route("round_robin", "other")
    assert [policy.choose(other, Ask(None), STATES, {}).host for _ in range(2)] == ["a", "b"]  # type: ignore[union-attr]


def test_a_reload_keeps_the_turns_of_the_routes_that_stay() -> None:
    policies = Policies(["lab", "old"])
    policy = policies.named("round_robin")
    assert isinstance(policy, RoundRobin)
    policy.turns.update(lab=5, old=2)
    policies.reload(["lab", "new"], {})
    assert policy.turns == {"lab": 5, "new": 0}


def test_cache_affinity_places_a_conversation_and_the_pages_ask_without_placing() -> None:
    policies = Policies(["lab"])
    lab = route("cache_affinity")
    policy = policies.of(lab)
    assert isinstance(policy, CacheAffinity)
    conversation = Conversation(b"k" * 16, 0)
    placed = policy.choose(lab, Ask(None, conversation), STATES, {"a": 1})
    assert placed is not None and placed.placement is not None
    assert placed.placement.outcome == "new"
    again = policy.choose(lab, Ask(None, conversation, now=1.0), STATES, {"a": 1})
    assert again is not None and again.host == placed.host and again.placement is not None
    assert again.placement.outcome == "home"
    # without a conversation: the least busy, and nothing placed
    busy = {"a": 2, "b": 0, "c": 1}
    plain = policy.choose(lab, Ask(None), STATES, busy, commit=False)
    assert plain is not None and (plain.host, plain.placement) == ("b", None)


def test_a_policy_says_where_a_conversation_s_last_turn_went() -> None:
    """What the queue asks to let a turn wait for its own host."""
    policies = Policies(["lab"])
    lab = route("cache_affinity")
    conversation = Conversation(b"k" * 16, 0)
    assert policies.of(lab).last_host(conversation.key) is None  # not placed yet
    placed = policies.of(lab).choose(lab, Ask(None, conversation), STATES, {})
    assert placed is not None and policies.of(lab).last_host(conversation.key) == placed.host
    assert policies.of(route("least_busy")).last_host(conversation.key) is None


def test_only_cache_affinity_reads_conversations() -> None:
    assert [name for name in POLICIES if places_conversations(route(name))] == ["cache_affinity"]


# -- placement: a model loaded on no healthy host goes where it is cheapest to load --------------


def _router(name: str, loaded: tuple[str, ...], room: int | None) -> HostState:
    known = ("m1", "m2", "m3")
    return HostState(name, f"http://{name}", True, loaded, known, max_instances=room)


def test_every_policy_loads_a_model_where_it_is_cheapest() -> None:
    from crossbar.routing.placement import Occupancy

    states = {
        "a": _router("a", ("m1",), 1),
        "b": _router("b", (), 1),
        "c": _router("c", ("m3",), 1),
    }
    usage = Occupancy(busy={("a", "m1"): 1})
    policies = Policies(["lab"], usage=usage)
    for name in POLICIES:
        lab = route(name)
        choice = policies.of(lab).choose(lab, Ask("m2", Conversation(b"x" * 16)), states, {})
        assert choice is not None and choice.host == "b", name  # the free instance
        assert choice.placement is not None or choice.load is not None
    # b busy too: c's idle model is evicted, never the busy m1 on a
    states["b"] = _router("b", ("m3",), 1)
    busy = Occupancy(busy={("a", "m1"): 1, ("b", "m3"): 2})
    policy = Policies(["lab"], usage=busy).of(route("priority"))
    choice = policy.choose(route("priority"), Ask("m2"), states, {}, commit=False)
    assert choice is not None and choice.load is not None
    assert (choice.host, choice.load.evicts) == ("c", "m3")
    # the model loaded on a host: there, whatever the rooms say
    loaded = policy.choose(route("priority"), Ask("m1"), states, {}, commit=False)
    assert loaded is not None and (loaded.host, loaded.load) == ("a", None)


def test_without_any_room_known_the_policy_picks_as_before() -> None:
    states = {n: _router(n, ("m1",) if n == "a" else (), None) for n in ("a", "b", "c")}
    lab = route("priority")
    choice = Policies(["lab"]).of(lab).choose(lab, Ask("m2"), states, {})
    assert choice is not None and (choice.host, choice.load) == ("a", None)  # the first

"""crossbar.routing.aliases: the model a name a client sends stands for on a route."""

from __future__ import annotations

from crossbar.config import RouteConfig
from crossbar.polling.health import HostState
from crossbar.routing import real_model

ALIASES = (("claude-haiku-*", "qwen3-4b"), ("claude-*", "qwen3-coder-30b"), ("gpt-5*", "q"))
ROUTE = RouteConfig("lab", ("gpu-a", "gpu-b"), "qwen3-coder-30b", aliases=ALIASES)


def states(*known: str, healthy: bool = True) -> dict[str, HostState]:
    return {"gpu-b": HostState(name="gpu-b", url="http://b", healthy=healthy, known=known)}


def test_the_first_pattern_that_matches_wins_in_the_config_s_order() -> None:
    assert real_model(ROUTE, "claude-haiku-4-5", {}) == "qwen3-4b"
    assert real_model(ROUTE, "claude-sonnet-4-5", {}) == "qwen3-coder-30b"
    assert real_model(ROUTE, "gpt-5-codex", {}) == "q"
    backwards = RouteConfig("lab", ("gpu-a",), None, aliases=ALIASES[1::-1])
    assert real_model(backwards, "claude-haiku-4-5", {}) == "qwen3-coder-30b"


def test_a_model_a_host_of_the_route_lists_wins_over_a_pattern_even_while_it_is_down() -> None:
    assert real_model(ROUTE, "claude-local", states("claude-local")) == "claude-local"
    assert real_model(ROUTE, "claude-local", states("claude-local", healthy=False)) == (
        "claude-local"
    )
    others = {"gpu-c": HostState(name="gpu-c", url="http://c", known=("claude-local",))}
    assert real_model(ROUTE, "claude-local", others) == "qwen3-coder-30b"  # not the route's


def test_matching_is_case_sensitive_and_a_name_no_pattern_matches_is_left_as_it_is() -> None:
    assert real_model(ROUTE, "Claude-Sonnet", {}) == "Claude-Sonnet"
    assert real_model(ROUTE, "llama", {}) == "llama"


def test_a_pattern_sent_back_as_a_name_stands_for_its_target() -> None:
    odd = RouteConfig("lab", ("gpu-a",), None, aliases=(("[ab]-7b", "m"),))
    assert real_model(odd, "[ab]-7b", {}) == "m"
    assert real_model(odd, "a-7b", {}) == "m"


def test_the_default_and_the_targets_are_never_mapped() -> None:
    loop = RouteConfig("lab", ("gpu-a",), "qwen3-x", aliases=(("qwen3-*", "qwen3-4b"),))
    assert real_model(loop, "qwen3-x", {}) == "qwen3-x"
    assert real_model(loop, "qwen3-4b", {}) == "qwen3-4b"
    assert real_model(loop, "qwen3-8b", {}) == "qwen3-4b"


def test_a_route_without_aliases_maps_nothing() -> None:
    assert real_model(RouteConfig("lab", ("gpu-a",), None), "claude-x", {}) == "claude-x"

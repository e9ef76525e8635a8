"""crossbar.routing.allowance: which models a route and a named key may ask for, and how
many model loads a minute a named key's requests may cause."""

from __future__ import annotations

import pytest

from crossbar.config import RouteConfig
from crossbar.config.secrets import KeyHolder
from crossbar.routing.allowance import LoadBudget, allows, refused_model

ROUTE = RouteConfig("lab", ("gpu-a",), None, models=("qwen3-*", "*/Llama-3*", "tiny-[ab]"))
ALICE = KeyHolder("alice", models=("qwen3-coder-*",), max_loads_per_minute=2)
BOB = KeyHolder("bob")


@pytest.mark.parametrize(
    ("model", "allowed"),
    [
        ("qwen3-coder-30b", True),
        ("meta/Llama-3.1-8B", True),
        ("tiny-a", True),
        ("tiny-c", False),
        ("Qwen3-coder", False),  # case-sensitive: a host's ids are
        ("llama-3", False),
        ("", False),
    ],
)
def test_a_route_s_patterns_are_globs_matched_case_sensitively(model: str, allowed: bool) -> None:
    assert allows(ROUTE.models, model) is allowed
    assert allows((), model)  # no list: every model


def test_a_request_for_a_model_outside_a_list_is_refused_in_words() -> None:
    assert refused_model(ROUTE, ALICE, "qwen3-coder-30b") is None
    assert refused_model(ROUTE, BOB, "qwen3-8b") is None
    assert refused_model(ROUTE, None, "qwen3-8b") is None
    assert (
        refused_model(ROUTE, ALICE, "qwen3-8b") == "model 'qwen3-8b' is not allowed for key alice"
    )
    assert refused_model(ROUTE, BOB, "gpt-4") == "model 'gpt-4' is not served on route lab"
    assert refused_model(ROUTE, ALICE, None) is None  # the route's default, if any, applies
    open_route = RouteConfig("open", ("gpu-a",), None)
    assert refused_model(open_route, BOB, "anything") is None
    said = refused_model(ROUTE, BOB, "\x1b[31m" + "x" * 10_000)
    assert said is not None and len(said) < 120 and "\x1b" not in said


def test_a_key_s_loads_are_counted_over_a_sliding_minute() -> None:
    budget = LoadBudget()
    assert budget.refusal(ALICE, 0.0) is None
    budget.count(ALICE, 0.0)
    budget.count(ALICE, 20.0)
    assert budget.refusal(ALICE, 30.0) == (
        "key alice: 2 model loads in the last minute already (max_loads_per_minute); "
        "try again in 30 s"
    )
    assert budget.refusal(ALICE, 60.0) is None  # the first load left the minute
    assert budget.loads("alice", 60.0) == 1


def test_keys_without_a_budget_are_never_refused_nor_counted() -> None:
    budget = LoadBudget()
    for second in range(100):
        budget.count(BOB, float(second))
        budget.count(None, float(second))
    assert budget.refusal(BOB, 100.0) is None and budget.refusal(None, 100.0) is None
    assert budget.loads("bob", 100.0) == 0


def test_a_budget_holds_at_most_its_limit_of_times() -> None:
    budget = LoadBudget()
    for second in range(1000):
        budget.count(ALICE, second / 100)
    assert budget.loads("alice", 10.0) == 2

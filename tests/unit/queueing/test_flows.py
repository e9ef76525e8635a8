"""crossbar.queueing.flows: a flow, a pool's limit, and a refusal in words."""

from __future__ import annotations

import pytest

from crossbar.queueing.flows import Flow, PoolLimit, Refused, refusal


def test_a_refusal_names_who_is_full_and_says_when_to_try_again() -> None:
    assert refusal("alice", 32, 7.2) == Refused(429, "alice: 32 requests already waiting", 8)
    assert refusal("lab", 0, 0.0) == Refused(429, "lab: every slot is busy, none may wait", 1)
    assert refusal("lab", 4, 1e9).retry_after == 300  # five minutes at most


@pytest.mark.parametrize(
    "wrong",
    [{"band": -1}, {"max_in_flight": 0}, {"max_waiting": -1}],
)
def test_a_flow_s_limits_are_checked(wrong: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Flow("alice", **wrong)
    assert Flow("alice", max_waiting=0).max_waiting == 0  # none may wait: allowed


def test_a_pool_limit_may_be_zero_never_negative() -> None:
    assert PoolLimit("lab", 0).max_waiting == 0
    with pytest.raises(ValueError):
        PoolLimit("lab", -1)

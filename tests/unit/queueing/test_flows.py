"""crossbar.queueing.flows: a flow, a pool's limit, and a refusal in words."""

from __future__ import annotations

import pytest

from crossbar.config import KeyHolder, RouteConfig, Secret
from crossbar.queueing import flow_of
from crossbar.queueing.flows import Flow, PoolLimit, Refused, refusal
from crossbar.queueing.queue import FairQueue, Waiting


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


def test_an_unnamed_key_is_normal_and_waits_its_turn_behind_a_named_normal_key() -> None:
    unnamed = Secret(b"u" * 24)
    alice = Secret(b"a" * 24, holder=KeyHolder("alice"))
    carol = Secret(b"c" * 24, holder=KeyHolder("carol", "interactive"))
    route = RouteConfig("lab", ("gpu",), None, api_keys=(unnamed, alice, carol))
    q: FairQueue[str] = FairQueue()
    for key, item in ((alice, "alice"), (unnamed, "unnamed"), (carol, "carol")):
        assert isinstance(q.push("pool", flow_of(route, [], "10.0.0.1", key), item, 0.0), Waiting)

    # carol is interactive; alice queued before the unnamed key, both normal
    assert [q.pop(["pool"], 1.0).item for _ in range(3)] == ["carol", "alice", "unnamed"]  # type: ignore[union-attr]
    assert flow_of(route, [], "10.0.0.1", unnamed).band == Flow("x").band

"""crossbar.queueing.traffic: requests in flight per host as a request moves between hosts,
and the policies' state kept across a reload."""

from __future__ import annotations

import pytest

from crossbar.queueing.traffic import Traffic
from crossbar.routing.policies import CacheAffinity, RoundRobin


def round_robin(traffic: Traffic) -> RoundRobin:
    policy = traffic.policies.named("round_robin")
    assert isinstance(policy, RoundRobin)
    return policy


def test_counters_start_at_zero_for_every_host_and_route() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat", "code"])
    assert traffic.in_flight == {"gpu-a": 0, "gpu-b": 0}
    assert round_robin(traffic).turns == {"chat": 0, "code": 0}


def test_a_request_arrives_moves_and_leaves() -> None:
    traffic = Traffic(["gpu-a", "gpu-b", "gpu-c"], ["chat"])
    traffic.move(None, "gpu-a")
    traffic.move(None, "gpu-a")
    assert traffic.in_flight == {"gpu-a": 2, "gpu-b": 0, "gpu-c": 0}
    traffic.move("gpu-a", "gpu-b")  # failed over
    assert traffic.in_flight == {"gpu-a": 1, "gpu-b": 1, "gpu-c": 0}
    traffic.move("gpu-b", None)
    traffic.move("gpu-a", None)
    assert traffic.in_flight == {"gpu-a": 0, "gpu-b": 0, "gpu-c": 0}


def test_a_move_from_nowhere_to_nowhere_changes_nothing() -> None:
    traffic = Traffic(["gpu-a"], ["chat"])
    traffic.move(None, None)
    assert traffic.in_flight == {"gpu-a": 0}


def test_a_move_to_the_same_host_keeps_its_count() -> None:
    traffic = Traffic(["gpu-a"], ["chat"])
    traffic.move(None, "gpu-a")
    traffic.move("gpu-a", "gpu-a")
    assert traffic.in_flight == {"gpu-a": 1}


def test_a_host_not_configured_is_an_error() -> None:
    traffic = Traffic(["gpu-a"], ["chat"])
    with pytest.raises(KeyError):
        traffic.move(None, "ghost")
    assert traffic.in_flight == {"gpu-a": 0}


# -- a reload: set_hosts ------------------------------------------------------------------------


class Gone:
    """Records each ``gone(name)`` call."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str) -> None:
        self.names.append(name)


def test_a_removed_idle_host_is_dropped_at_once() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"])
    gone = Gone()
    traffic.move(None, "gpu-a")
    left = traffic.set_hosts(["gpu-a"], ["chat"], {}, gone)
    assert left == []
    assert traffic.in_flight == {"gpu-a": 1}  # the host that stays keeps its count
    assert traffic.leaving == {}
    assert gone.names == []  # dropped here, not told later


def test_a_removed_busy_host_counts_until_its_last_request_ends() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"])
    gone = Gone()
    traffic.move(None, "gpu-b")
    traffic.move(None, "gpu-b")
    left = traffic.set_hosts(["gpu-a", "gpu-c"], ["chat"], {}, gone)
    assert left == ["gpu-b"]
    assert traffic.in_flight == {"gpu-a": 0, "gpu-b": 2, "gpu-c": 0}
    assert list(traffic.leaving) == ["gpu-b"]
    traffic.move("gpu-b", None)
    assert traffic.in_flight["gpu-b"] == 1 and gone.names == []
    traffic.move("gpu-b", None)
    assert gone.names == ["gpu-b"]
    assert traffic.in_flight == {"gpu-a": 0, "gpu-c": 0}
    assert traffic.leaving == {}


def test_a_request_failing_over_off_a_leaving_host_ends_it_there() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"])
    gone = Gone()
    traffic.move(None, "gpu-b")
    traffic.set_hosts(["gpu-a"], ["chat"], {}, gone)
    traffic.move("gpu-b", "gpu-a")
    assert gone.names == ["gpu-b"]
    assert traffic.in_flight == {"gpu-a": 1}


def test_a_leaving_host_configured_again_stays_and_is_never_gone() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"])
    gone = Gone()
    traffic.move(None, "gpu-b")
    assert traffic.set_hosts(["gpu-a"], ["chat"], {}, gone) == ["gpu-b"]
    assert traffic.set_hosts(["gpu-a", "gpu-b"], ["chat"], {}, gone) == []
    assert traffic.leaving == {}
    assert traffic.in_flight == {"gpu-a": 0, "gpu-b": 1}  # its request still counted
    traffic.move("gpu-b", None)
    assert gone.names == []
    assert traffic.in_flight == {"gpu-a": 0, "gpu-b": 0}


def test_the_routes_turns_follow_a_reload() -> None:
    traffic = Traffic(["gpu-a"], ["chat", "code", "old"])
    round_robin(traffic).turns["chat"] = 7
    round_robin(traffic).turns["old"] = 3
    traffic.set_hosts(["gpu-a"], ["chat", "new", "code"], {}, Gone())
    assert round_robin(traffic).turns == {"chat": 7, "code": 0, "new": 0}


def test_a_reload_gives_the_hosts_slots_to_the_conversations() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"], {"gpu-a": 2})
    traffic.set_hosts(["gpu-a", "gpu-b"], ["chat"], {"gpu-b": 4}, Gone())
    policy = traffic.policies.named("cache_affinity")
    assert isinstance(policy, CacheAffinity)
    assert policy.conversations.slots == {"gpu-b": 4}
    assert policy.conversations.has_room("gpu-a", 0.0)


def test_the_last_use_of_a_model_on_a_host_is_when_a_request_last_left_it() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], [])
    traffic.move(None, "gpu-a", "qwen", 10.0)
    assert traffic.last_used == {}  # in flight: busy, whatever its last use
    assert traffic.usage.idle("gpu-a", "qwen", 11.0) == 0.0
    traffic.move("gpu-a", "gpu-b", "qwen", 12.0)  # a failover
    traffic.move("gpu-b", None, "qwen", 20.0)
    assert traffic.last_used == {("gpu-a", "qwen"): 12.0, ("gpu-b", "qwen"): 20.0}
    assert traffic.usage.idle("gpu-b", "qwen", 25.0) == 5.0
    traffic.move(None, "gpu-a", "llama")  # no time given: nothing kept
    assert ("gpu-a", "llama") not in traffic.last_used


def test_made_up_model_names_cannot_grow_the_last_uses() -> None:
    from crossbar.queueing.traffic import MAX_LAST_USED

    traffic = Traffic(["gpu-a"], [])
    traffic.move(None, "gpu-a", "kept", 0.0)
    traffic.move("gpu-a", None, "kept", 0.0)
    traffic.move(None, "gpu-a", "kept", 0.0)  # in flight again, throughout: never dropped
    for n in range(MAX_LAST_USED + 10):
        traffic.move(None, "gpu-a", f"m{n}", float(n))
        traffic.move("gpu-a", None, f"m{n}", float(n))
    assert len(traffic.last_used) <= MAX_LAST_USED
    assert ("gpu-a", "kept") in traffic.last_used
    assert ("gpu-a", f"m{MAX_LAST_USED + 9}") in traffic.last_used


def test_shared_counts_add_the_other_workers_slots_to_this_one_s() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"], {"gpu-a": 2}, shared=True)
    told: list[int] = []
    traffic.changed = lambda: told.append(1)
    traffic.move(None, "gpu-a", "m")
    traffic.set_others({("gpu-a", "m"): 1, ("gpu-gone", "m"): 5})  # a host not configured
    assert traffic.in_flight == {"gpu-a": 1, "gpu-b": 0}  # this worker's own
    assert traffic.fleet_in_flight == {"gpu-a": 2, "gpu-b": 0}
    assert traffic.fleet_busy == {("gpu-a", "m"): 2}
    traffic.move("gpu-a", "gpu-b", "m")
    assert traffic.fleet_busy == {("gpu-a", "m"): 1, ("gpu-b", "m"): 1}
    traffic.set_others({})  # worker 0 lost: own counts only
    assert traffic.fleet_in_flight == traffic.in_flight == {"gpu-a": 0, "gpu-b": 1}
    assert told == [1, 1]  # each move is told


def test_alone_the_fleet_counts_are_this_process_s() -> None:
    traffic = Traffic(["gpu-a"], ["chat"])
    assert traffic.fleet_busy is traffic.busy and traffic.fleet_in_flight is traffic.in_flight

"""crossbar.fleet.traffic: requests in flight per host as a request moves between hosts,
and the record of one proxied request."""

from __future__ import annotations

import attrs
import pytest

from crossbar.fleet.traffic import Outcome, Traffic


def test_counters_start_at_zero_for_every_host_and_route() -> None:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat", "code"])
    assert traffic.in_flight == {"gpu-a": 0, "gpu-b": 0}
    assert traffic.turns == {"chat": 0, "code": 0}


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


def test_outcome_is_frozen() -> None:
    outcome = Outcome(route="chat", host="gpu-a", status=200, seconds=1.5, first_byte=0.2, sent=42)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        outcome.status = 500  # type: ignore[misc]
    assert outcome == Outcome("chat", "gpu-a", 200, 1.5, 0.2, 42)
    assert attrs.asdict(Outcome("-", None, 499, 0.0, None, 0)) == {
        "route": "-",
        "host": None,
        "status": 499,
        "seconds": 0.0,
        "first_byte": None,
        "sent": 0,
        "model": None,
        "affinity": None,
    }

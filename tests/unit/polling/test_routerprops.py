"""crossbar.polling.routerprops: a router's room read from its own ``/props``, and when to ask."""

from __future__ import annotations

import json

import pytest

from crossbar.polling.routerprops import ASK_AGAIN_SECONDS, MAX_INSTANCES, Room, RoomAsks, read_room


def test_a_router_tells_its_max_instances_and_autoload() -> None:
    body = {"role": "router", "max_instances": 4, "models_autoload": False, "build_info": "b1"}
    assert read_room(json.dumps(body).encode()) == Room(4, False)


@pytest.mark.parametrize(
    "body",
    [
        b'{"total_slots": 4, "model_alias": "m"}',  # single-model: no role, no room
        b'{"role": "router", "max_instances": 0}',
        b'{"role": "router", "max_instances": %d}' % (MAX_INSTANCES + 1),
        b'{"role": "router", "max_instances": "4"}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_anything_else_tells_no_room(body: bytes) -> None:
    assert read_room(body).max_instances is None


def test_asked_once_then_every_minute_and_at_once_after_a_failure() -> None:
    asks = RoomAsks()
    assert asks.due("gpu-a", 0.0) and not asks.due("gpu-a", 5.0)
    assert asks.due("gpu-b", 5.0)  # each host on its own
    assert asks.due("gpu-a", ASK_AGAIN_SECONDS)
    asks.forget("gpu-a")
    assert asks.due("gpu-a", ASK_AGAIN_SECONDS + 1)

"""crossbar.queueing.lanes: where requests wait, and a route's count of them across its
pools, which says whose request gives way when the route is full."""

from __future__ import annotations

from crossbar.queueing.flows import BANDS, Flow
from crossbar.queueing.lanes import RouteQueue, Waiting, age

NORMAL = Flow("alice")
BATCH = Flow("bulk", BANDS["batch"])
OTHER = Flow("bob")


def waiting(flow: Flow, seq: int, arrived: float = 0.0, pool: str = "m") -> Waiting[str]:
    return Waiting(f"r{seq}", flow, pool, arrived, None, seq)


def test_a_route_counts_its_requests_across_every_pool() -> None:
    room = RouteQueue()
    for seq, pool in enumerate(["model-a", "model-b", "home-h1"]):
        room.add(waiting(NORMAL, seq, pool=pool))
    assert room.live == 3
    assert room.places == {"alice": 3}


def test_the_flow_holding_the_most_places_gives_its_newest() -> None:
    room = RouteQueue()
    for seq in range(4):
        room.add(waiting(NORMAL, seq))
    room.add(waiting(OTHER, 4))
    assert room.most(besides=0) == "alice"
    assert room.newest("alice").seq == 3


def test_no_flow_gives_way_when_it_holds_barely_more_than_the_newcomer() -> None:
    """Shedding one of a flow with one place more would only make the newcomer the one
    holding the most."""
    room = RouteQueue()
    room.add(waiting(NORMAL, 0))
    room.add(waiting(NORMAL, 1))
    assert room.most(besides=1) is None
    assert room.most(besides=0) == "alice"


def test_on_a_tie_the_lower_band_gives_way() -> None:
    room = RouteQueue()
    for seq in range(2):
        room.add(waiting(BATCH, seq))
    for seq in range(2, 4):
        room.add(waiting(NORMAL, seq))
    assert room.most(besides=0) == "bulk"


def test_a_request_gone_leaves_the_count_and_the_newest_is_a_live_one() -> None:
    room = RouteQueue()
    first, second = waiting(NORMAL, 0), waiting(NORMAL, 1)
    room.add(first)
    room.add(second)
    second.live = False
    room.drop(second)
    assert room.places == {"alice": 1}
    assert room.newest("alice") is first
    first.live = False
    room.drop(first)
    assert room.places == {} and room.live == 0


def test_age_is_the_oldest_live_request_s_wait() -> None:
    gone, kept = waiting(NORMAL, 0, arrived=1.0), waiting(NORMAL, 1, arrived=4.0)
    gone.live = False
    order = RouteQueue().order
    order.extend([gone, kept])
    assert age(order, 10.0) == 6.0
    assert list(order) == [kept]

"""crossbar.queueing.answers: what admission answers, and what the queue asks of the other
workers (``workers: N``): a slot freed here goes to the request waiting first in any
worker, and a slot freed elsewhere is taken by the request waiting first here."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import cast

from twisted.internet.task import Clock

from crossbar.queueing import Flow, Go, Head, Queued, Traffic, Waits
from crossbar.queueing.waits import KEEP, TICK
from tests.support.waiting import Told, proxy

ALICE = Flow("alice", 1, None, 1)


class OtherWorkers:
    """The other workers, as the queue sees them: a request of theirs waits first or not."""

    def __init__(self, first: bool) -> None:
        self.first = first
        self.given: list[tuple[str, str | None, list[Head]]] = []
        self.changes = 0

    def waiting(self) -> bool:
        return self.first

    def ahead(self, pools: Sequence[Hashable], head: Head) -> bool:
        return self.first

    def owed(
        self, host: str, model: str | None, pools: Sequence[Hashable], mine: Sequence[Head]
    ) -> bool:
        if self.first:
            self.given.append((host, model, list(mine)))
        return self.first

    def hand_over(self, host: str, model: str | None, pools: Sequence[Hashable]) -> bool:
        self.given.append((host, model, []))  # whatever waits here: the count decides
        return True

    def changed(self) -> None:
        self.changes += 1


def shared_waits(first: bool) -> tuple[Waits, OtherWorkers, Traffic]:
    memory = proxy()
    others = OtherWorkers(first)
    waits = Waits(memory.traffic, memory.table, memory.clock, others)
    waits.configure(memory.config)
    for host in ("gpu-a", "gpu-b"):
        memory.traffic.move(None, host, "m")  # every slot taken
    return waits, others, memory.traffic


def test_a_slot_freed_here_goes_to_the_request_waiting_first_in_another_worker() -> None:
    waits, others, _ = shared_waits(first=True)
    route, here = waits.route("lab"), Told()
    assert route is not None
    assert isinstance(waits.admit(here, route, "m", ALICE), Queued)
    assert others.changes == 1  # the others are told it waits
    waits.release(None, "gpu-a", "m")
    assert here.told == []  # the slot was given over, not taken here
    ((host, model, mine),) = others.given
    assert (host, model) == ("gpu-a", "m")
    assert [head[3] for head in mine] == ["alice"]  # what waits here, for the comparison


def test_a_slot_freed_here_stays_here_when_this_worker_waits_first() -> None:
    waits, others, _ = shared_waits(first=False)
    route, here = waits.route("lab"), Told()
    assert route is not None
    waits.admit(here, route, "m", ALICE)
    waits.release(None, "gpu-a", "m")
    assert here.told and here.told[0][0] == "dispatched" and others.given == []


def test_a_slot_offered_by_another_worker_is_taken_by_the_first_request_waiting_here() -> None:
    waits, _, traffic = shared_waits(first=False)
    route, here = waits.route("lab"), Told()
    assert route is not None
    assert waits.offered("gpu-a", "m") is False  # nobody waits here: passed on
    waits.admit(here, route, "m", ALICE)
    traffic.move("gpu-a", None, "m")  # freed in the other worker: worker 0 offers it
    assert waits.offered("gpu-a", "m") is True
    assert here.told and here.told[0][0] == "dispatched"


def test_an_offered_slot_is_passed_on_when_a_request_elsewhere_waits_first() -> None:
    """Worker 0 offers by what this worker last reported; if the request it was offered for
    has gone since, one waiting elsewhere may come before what waits here now."""
    waits, _, traffic = shared_waits(first=True)
    route, here = waits.route("lab"), Told()
    assert route is not None
    waits.admit(here, route, "m", ALICE)
    traffic.move("gpu-a", None, "m")
    assert waits.offered("gpu-a", "m") is False
    assert here.told == []


def test_the_other_workers_slots_make_a_host_full_here() -> None:
    memory = proxy()
    traffic = Traffic(["gpu-a", "gpu-b"], ["lab"], {"gpu-a": 1, "gpu-b": 1}, shared=True)
    waits = Waits(traffic, memory.table, memory.clock)
    waits.configure(memory.config)
    route = waits.route("lab")
    assert route is not None
    traffic.set_others({("gpu-a", "m"): 1, ("gpu-b", "m"): 1})  # both held elsewhere
    assert isinstance(waits.admit(Told(), route, "m", ALICE), Queued)
    traffic.set_others({("gpu-a", "m"): 1})
    assert isinstance(waits.admit(Told(), route, "m", Flow("bob", 1)), Go)  # gpu-b is free


def test_a_kept_slot_its_flow_did_not_take_goes_by_the_fleet_s_order() -> None:
    """The flow's next request may have gone to another worker or replica, which the shared
    count hears of before this one does: the slot is given over, whatever this worker knows
    waits elsewhere, and the shared count offers it to the first request anywhere."""
    waits, others, _ = shared_waits(first=False)
    route, here = waits.route("lab"), Told()
    assert route is not None
    waits.admit(here, route, "m", ALICE)  # normal band: waits here
    waits.release(Flow("bob", 0, None, 1), "gpu-a", "m", 1.0)  # interactive: kept for bob
    assert others.given == [] and here.told == []
    cast(Clock, waits.clock).advance(KEEP)  # bob's next request did not come here
    assert others.given == [("gpu-a", "m", [])]
    assert here.told == []  # the shared count offers it: to alice, if she is first


def test_a_kept_slot_goes_to_its_flow_s_next_request_when_that_waits_here() -> None:
    """The next request came here: this worker's order decides first, so the slot kept
    for it is not given over before the others have heard that it waits."""
    waits, others, _ = shared_waits(first=False)
    route, alice, bob = waits.route("lab"), Told(), Flow("bob", 0, None, 1)
    assert route is not None
    waits.admit(alice, route, "m", ALICE)  # normal band: waits here
    waits.release(bob, "gpu-a", "m", 1.0)  # interactive: kept for bob's next request
    here = Told()
    assert isinstance(waits.admit(here, route, "m", bob), Queued)  # every slot counted taken
    cast(Clock, waits.clock).advance(0)
    assert here.told and here.told[0][0] == "dispatched"
    assert others.given == [] and alice.told == []


def test_a_request_waiting_first_elsewhere_is_not_passed_by_a_look_at_the_queue() -> None:
    """When room shows in the shared count (a slot freed elsewhere), the queue's periodic
    look sends nothing while another worker's request waits first: that one gets it."""
    waits, others, traffic = shared_waits(first=True)
    route, here = waits.route("lab"), Told()
    assert route is not None
    waits.admit(here, route, "m", ALICE)
    traffic.move("gpu-a", None, "m")  # freed in another worker, as the count now shows
    clock = cast(Clock, waits.clock)
    clock.advance(TICK)
    assert here.told == []
    others.first = False  # now it waits first
    clock.advance(TICK)
    assert here.told and here.told[0][0] == "dispatched"


def test_a_request_sent_for_a_freed_slot_goes_to_that_host() -> None:
    """A shared count may show another host free a moment before it hears that the host
    was taken again: a request sent from the queue for gpu-a's freed slot goes to gpu-a,
    whatever the count says of gpu-b."""
    waits, _, traffic = shared_waits(first=False)
    route = waits.route("lab")
    assert route is not None
    went: list[object] = []

    class Sent(Told):
        def dispatched(self, waited: float) -> None:
            assert route is not None
            went.append(waits.admit(self, route, "m", ALICE, waited=True))

    waits.admit(Sent(), route, "m", ALICE)
    traffic.move("gpu-b", None, "m")  # gpu-b looks free: the count is behind (no dispatch)
    waits.release(None, "gpu-a", "m")
    assert went == [Go(("gpu-b",))]  # only gpu-a left to choose

"""crossbar.sharing.member: a worker tells worker 0 what it holds and has waiting, counts
the others' slots with its own, hands a freed slot over only when a request waits first in
another worker (by band, then its flow's requests in flight in every worker, then first
come), and counts its own requests alone while worker 0 is not heard."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, cast

from twisted.internet.task import Clock

from crossbar.queueing import Traffic
from crossbar.sharing.ledger import Holding, SlotKey, View
from crossbar.sharing.member import Member
from crossbar.testing import LogCapture
from tests.support.sharing import StubWaits

SLOT = ("gpu-a", "m")
CHAT = ("chat", "m")
HOME = ("chat", "m", "gpu-a")


class Uplink:
    """Worker 0 as a member reaches it: every report and gift, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def report(self, report: Holding) -> None:
        self.sent.append(("report", dict(report.counts), dict(report.heads), dict(report.flows)))

    def give(self, slot: SlotKey, pools: Sequence[Hashable], gift: int) -> None:
        self.sent.append(("give", slot, list(pools), gift))


def member(up: bool = True, takes: bool = False) -> tuple[Member, Uplink, Clock, StubWaits]:
    clock = Clock()
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"], shared=True)
    found = Member("w1", traffic, clock)
    traffic.changed = found.changed
    waits = StubWaits(traffic, takes)
    found.waits = cast(Any, waits)
    uplink = Uplink()
    if up:
        found.joined(uplink)
        uplink.sent.clear()
    return found, uplink, clock, waits


def test_joining_worker_0_reports_what_this_worker_holds_at_once() -> None:
    m, uplink, _, waits = member(up=False)
    m.traffic.move(None, "gpu-a", "m")
    waits.queue.waiting[CHAT] = (0, 0, 1.0, "alice")
    waits.queue.flows["bob"] = 1
    assert not m.up and uplink.sent == []
    m.joined(uplink)
    assert m.up
    assert uplink.sent == [("report", {SLOT: 1}, {CHAT: (0, 0, 1.0, "alice")}, {"bob": 1})]


def test_changes_are_reported_once_a_reactor_turn_and_only_when_they_change() -> None:
    m, uplink, clock, _ = member()
    m.traffic.move(None, "gpu-a", "m")
    m.traffic.move(None, "gpu-a", "m")
    assert uplink.sent == []
    clock.advance(0)
    assert uplink.sent == [("report", {SLOT: 2}, {}, {})]
    m.traffic.move(None, "gpu-b", "m")
    m.traffic.move("gpu-b", None, "m")  # came and went in one turn: nothing new to say
    clock.advance(0)
    assert len(uplink.sent) == 1


def test_the_others_counts_are_added_to_this_workers_own() -> None:
    m, _, _, _ = member()
    m.traffic.move(None, "gpu-a", "m")
    m.others(View(Holding({SLOT: 2, ("gpu-b", None): 1}, {}, {}), 0))
    assert m.traffic.fleet_busy == {SLOT: 3, ("gpu-b", None): 1}
    assert m.traffic.fleet_in_flight == {"gpu-a": 3, "gpu-b": 1}
    assert m.traffic.busy == {SLOT: 1}  # what it reports is its own alone


def test_a_light_flow_waiting_elsewhere_comes_before_a_heavy_flow_waiting_here() -> None:
    m, uplink, _, waits = member()
    waits.queue.flows["heavy"] = 3  # the heavy flow runs 3 here, and 5 elsewhere
    m.others(View(Holding({}, {CHAT: (0, 0, 9.0, "light")}, {"heavy": 5}), 0))
    assert m.waiting()
    assert waits.queue.others == {"heavy": 5}  # this worker's queue ranks by the fleet's count
    heavy = (0, 3, 1.0, "heavy")  # came long before the light one
    assert m.ahead([CHAT], heavy)
    assert m.owed("gpu-a", "m", [CHAT, HOME], [heavy])
    assert uplink.sent == [("give", SLOT, [CHAT, HOME], 1)]


def test_one_flow_s_requests_go_first_come_whichever_worker_holds_them() -> None:
    m, uplink, _, waits = member()
    waits.queue.flows["alice"] = 1  # what this worker runs is not held against its own
    m.others(View(Holding({}, {CHAT: (0, 0, 2.0, "alice")}, {"alice": 1}), 0))
    assert not m.owed("gpu-a", "m", [CHAT], [(0, 1, 1.0, "alice")])  # here came first
    assert m.owed("gpu-a", "m", [CHAT], [(0, 1, 3.0, "alice")])  # there came first
    assert [sent[0] for sent in uplink.sent] == ["give"]


def test_a_freed_slot_stays_when_nobody_elsewhere_waits_for_it() -> None:
    m, uplink, _, _ = member()
    m.others(View(Holding({}, {("code", "m"): (0, 0, 1.0, "bob")}, {}), 0))
    assert not m.owed("gpu-a", "m", [CHAT, HOME], [])
    assert not m.ahead([CHAT], (9, 9, 9.0, "x"))
    assert uplink.sent == []


def test_a_fresh_look_gives_the_slot_over_whatever_this_worker_knows() -> None:
    """A kept slot its flow did not take: the shared count knows sooner where the flow's
    next request waits, so it decides (it may offer the slot back here)."""
    m, uplink, _, _ = member()
    mine = (0, 0, 1.0, "alice")
    assert not m.owed("gpu-a", "m", [CHAT], [mine])  # nothing known elsewhere
    assert m.hand_over("gpu-a", "m", [CHAT])  # but the count may know more
    assert uplink.sent == [("give", SLOT, [CHAT], 1)]
    m.lost("gone")
    assert not m.hand_over("gpu-a", "m", [CHAT])  # nobody to decide: here


def test_a_gift_counts_as_held_elsewhere_until_worker_0_has_counted_it() -> None:
    m, uplink, clock, _ = member()
    m.others(View(Holding({}, {CHAT: (0, 0, 1.0, "bob")}, {}), 0))
    assert m.owed("gpu-a", "m", [CHAT], [])
    assert m.owed("gpu-a", "m", [CHAT], [])
    assert m.traffic.fleet_busy == {SLOT: 2}  # no request of this worker takes them meanwhile
    m.others(View(Holding({SLOT: 1}, {}, {}), 1))  # worker 0 counted the first: offered elsewhere
    assert m.traffic.fleet_busy == {SLOT: 2}
    m.others(View(Holding({SLOT: 2}, {}, {}), 2))
    assert m.traffic.fleet_busy == {SLOT: 2}
    m.others(View(Holding({}, {}, {}), 2))  # both taken and ended elsewhere
    assert m.traffic.fleet_busy == {}
    clock.advance(0)
    assert [sent[3] for sent in uplink.sent if sent[0] == "give"] == [1, 2]


def test_an_offered_slot_is_taken_by_a_waiting_request_and_counted_before_the_answer() -> None:
    m, uplink, _, waits = member(takes=True)
    assert m.offer(SLOT) is True
    assert waits.offers == [SLOT]
    assert uplink.sent == [("report", {SLOT: 1}, {}, {})]  # its count, then the answer


def test_an_offered_slot_nobody_here_wants_is_passed_on() -> None:
    m, _, _, waits = member(takes=False)
    assert m.offer(SLOT) is False
    assert waits.offers == [SLOT]


def test_without_worker_0_a_worker_counts_its_own_requests_only() -> None:
    m, uplink, clock, _ = member(up=False)
    m.others(View(Holding({SLOT: 5}, {CHAT: (0, 0, 1.0, "bob")}, {}), 0))  # not heard: ignored
    m.traffic.move(None, "gpu-a", "m")
    clock.advance(0)
    assert m.traffic.fleet_busy == {SLOT: 1}
    assert not m.waiting() and not m.owed("gpu-a", "m", [CHAT], [])
    assert uplink.sent == []
    assert next(m.collect()).samples[0].value == 0


def test_losing_worker_0_clears_the_others_and_is_said_once_and_back_once() -> None:
    m, uplink, _, waits = member()
    assert next(m.collect()).samples[0].value == 1
    m.others(View(Holding({SLOT: 2}, {CHAT: (0, 0, 1.0, "bob")}, {"bob": 2}), 0))
    logs = LogCapture()
    try:
        m.lost("connection refused")
        m.lost("connection refused")
        assert m.traffic.fleet_busy == {} and not m.waiting()
        assert waits.queue.others == {}  # the queue ranks by this worker's own count again
        m.joined(uplink)
    finally:
        logs.close()
    lines = logs.lines
    assert len([line for line in lines if "is lost (connection refused)" in line]) == 1
    assert len([line for line in lines if "count is back" in line]) == 1

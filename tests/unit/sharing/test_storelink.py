"""crossbar.sharing.storelink: a replica is a member of the store's count while both its
connections are up; it reads the ledger on every other member's change and before it
answers an offer, says once that the count is lost when a call fails or a connection
closes (and counts its own), and reports again when the store no longer knows it.

The store here is a double that answers each script run from what the test sets; the
script itself runs against a real redis-server in ``tests/system/test_script.py``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from crossbar.queueing import Traffic
from crossbar.routing import Conversations
from crossbar.sharing.ledger import Holding
from crossbar.sharing.member import Member
from crossbar.sharing.placesync import PlacementSync
from crossbar.sharing.store import changes_channel, dump_stored, offers_channel
from crossbar.sharing.storelink import BEAT, StoreLink
from crossbar.sharing.storeplacements import placed_channel
from crossbar.testing import LogCapture
from tests.support.sharing import StubWaits

SLOT = ("gpu-a", "m")
CHAT = ("chat", "m")


class Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abortConnection(self) -> None:
        self.aborted = True


class Store:
    """The command connection: each script run recorded; ``read`` answers the ledger set in
    :attr:`reports`, ``beat`` whether the member is known, and a run may be made to fail."""

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []
        self.reports: dict[str, Holding] = {}
        self.offered: list[tuple[str, str]] = []
        self.known = True
        self.failing = False
        self.transport = Transport()

    def eval(
        self, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()
    ) -> Deferred[Any]:
        op, name = args[0], args[3] if len(args) > 3 else None
        self.runs.append([op, name, *args[4:]])
        if self.failing:
            return fail(TimeoutError("Not received Redis response in 1.0 seconds"))
        if op == "read":
            flat = [x for n, h in self.reports.items() for x in (n, dump_stored(h))]
            offered = [x for pair in self.offered for x in pair]
            return succeed([flat, offered, []])
        if op == "beat":
            return succeed(1 if self.known else 0)
        if op == "since":
            return succeed(["0", "0", []])
        return succeed(0)

    def ops(self) -> list[str]:
        return [run[0] for run in self.runs]


class Subscription:
    def __init__(self) -> None:
        self.channels: list[str] = []
        self.transport = Transport()

    def subscribe(self, channels: list[str]) -> Deferred[Any]:
        self.channels = channels
        return succeed(None)


def joined() -> tuple[StoreLink, Store, Subscription, Clock, StubWaits]:
    clock = Clock()
    traffic = Traffic(["gpu-a"], ["chat"], shared=True)
    member = Member("r1", traffic, clock, keeper="the store redis://store:6379/0")
    traffic.changed = member.changed
    waits = StubWaits(traffic, takes=True)
    member.waits = cast(Any, waits)
    link, store, subscription = StoreLink(member, clock), Store(), Subscription()
    store.reports["r2"] = Holding({SLOT: 1}, {CHAT: (1, 0, 5.0, "bob")}, {"bob": 1})
    link.opened(cast(Any, store))
    assert not member.up  # not before it hears changes and offers
    link.subscribing(cast(Any, subscription))
    return link, store, subscription, clock, waits


def test_a_replica_joins_once_both_connections_are_up() -> None:
    link, store, subscription, _, _ = joined()
    assert link.member.up and link.member.uplink is link
    assert subscription.channels == [changes_channel(), offers_channel("r1")]
    assert store.ops() == ["report", "read"]  # what it holds, then what the others do
    assert link.member.traffic.fleet_busy == {SLOT: 1}  # r2's slot counted here


def test_another_member_s_change_is_read_its_own_is_not() -> None:
    link, store, _, _, _ = joined()
    store.reports["r2"] = Holding({SLOT: 2})
    before = len(store.runs)
    link.heard(changes_channel(), "r1")
    assert len(store.runs) == before
    link.heard(changes_channel(), "r2")
    assert store.ops()[-1] == "read"
    assert link.member.traffic.fleet_busy == {SLOT: 2}


def test_an_offer_is_answered_after_a_fresh_read() -> None:
    link, store, _, _clock, waits = joined()
    store.reports["r2"] = Holding({}, {}, {})  # the giver no longer holds it
    link.heard(offers_channel("r1"), '{"id": "7", "slot": "[\\"gpu-a\\",\\"m\\"]"}')
    assert waits.offers == [SLOT]  # taken: its report first, then the answer
    assert store.ops()[-3:] == ["read", "report", "answer"]
    assert store.runs[-1] == ["answer", "r1", "7", "1"]


def test_a_malformed_offer_is_left_alone() -> None:
    link, store, _, _, waits = joined()
    before = len(store.runs)
    for message in ("not json", "[]", '{"slot": "x"}', '{"id": 7}', "[" * 5000):
        link.heard(offers_channel("r1"), message)
    assert len(store.runs) == before and waits.offers == []


def test_a_failed_call_drops_both_connections_and_is_said_once() -> None:
    link, store, subscription, _clock, _ = joined()
    logs = LogCapture()
    try:
        store.failing = True
        link.heard(changes_channel(), "r2")
        link.heard(changes_channel(), "r2")
    finally:
        logs.close()
    assert store.transport.aborted and subscription.transport.aborted
    assert not link.member.up and link.member.traffic.fleet_busy == {}  # its own only
    lost = logs.matching("the shared slot count (the store redis://store:6379/0) is lost")
    assert len(lost) == 1 and "Not received Redis response in 1.0 seconds" in lost[0]


def test_a_closed_connection_is_lost_and_both_back_is_joined_again() -> None:
    link, _store, subscription, _, _ = joined()
    link.closed(subscription)
    assert not link.member.up
    link.closed(object())  # not one of its own: nothing
    logs = LogCapture()
    try:
        link.subscribing(cast(Any, Subscription()))
    finally:
        logs.close()
    assert link.member.up and logs.matching("r1: the shared slot count is back")


def test_a_member_the_store_forgot_reports_again_at_its_next_beat() -> None:
    link, store, _, clock, _ = joined()
    link.member.traffic.move(None, "gpu-a", "m")
    clock.advance(0)
    store.known = False  # the store was emptied, or the lease ran out
    reports = store.ops().count("report")
    clock.advance(BEAT)
    assert store.ops().count("report") == reports + 1
    assert store.runs[-2][0] == "report" and store.runs[-1][0] == "read"


def test_stopping_leaves_the_store_at_once() -> None:
    link, store, _, clock, _ = joined()
    link.leave()
    assert store.runs[-1] == ["leave", "r1"]
    beats = store.ops().count("beat")
    clock.advance(BEAT * 3)
    assert store.ops().count("beat") == beats  # no more heartbeats


# -- conversations' placements (cache_affinity) ----------------------------------------------


def placing() -> tuple[StoreLink, Store, Subscription, Clock, Conversations]:
    """A replica joined to the store whose member shares ``cache_affinity``'s placements."""
    clock, table = Clock(), Conversations({"gpu-a": 1})
    traffic = Traffic(["gpu-a"], ["chat"], shared=True)
    placements = PlacementSync(table, clock, lambda host: host == "gpu-a")
    member = Member("r1", traffic, clock, "the store", placements)
    link, store, subscription = StoreLink(member, clock), Store(), Subscription()
    link.opened(cast(Any, store))
    link.subscribing(cast(Any, subscription))
    return link, store, subscription, clock, table


def test_a_replica_shares_placements_while_it_is_joined() -> None:
    link, store, subscription, clock, table = placing()
    assert subscription.channels[-1] == placed_channel()
    assert store.ops()[-1] == "since"  # the others' live placements, read as it joins
    table.place(bytes(16), ["gpu-a"], {}, 1.5, clock.seconds(), turn=0)
    clock.advance(0)
    assert store.ops()[-1] == "put" and store.runs[-1][2] == "r1"
    link.closed(subscription)
    assert table.outgoing is None  # places alone meanwhile


def test_another_replica_s_placements_are_taken_from_its_message_its_own_are_not() -> None:
    link, store, _, clock, table = placing()
    reads = store.ops().count("since")
    a, b = bytes(16), bytes([1] * 16)
    link.heard(placed_channel(), json.dumps(["r1", [[a.hex(), "gpu-a", 0]]]))
    link.heard(placed_channel(), json.dumps(["r2", [[b.hex(), "gpu-a", 1]]]))
    link.heard(placed_channel(), "not json")
    assert table.host_of(a) is None and table.host_of(b) == "gpu-a"
    assert store.ops().count("since") == reads  # no read needed
    clock.advance(BEAT)  # but one at each beat, in case a message was lost
    assert store.ops().count("since") == reads + 1

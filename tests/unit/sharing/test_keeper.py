"""crossbar.sharing.keeper: worker 0 tells every worker the others' counts once a reactor
turn, offers a freed slot to the worker whose request waits first (then the next, when one
passes, fails or is too slow), frees what a worker held when it goes, and refuses a worker
without the run's secret."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.protocols import amp
from twisted.test import iosim

from crossbar.queueing import Head
from crossbar.routing import LIVE_SECONDS, Placed
from crossbar.sharing import wire
from crossbar.sharing.keeper import OFFER_TIMEOUT, Keeper, KeeperFactory, KeeperProtocol, abort
from crossbar.sharing.ledger import HEARTBEAT, LEASE, Holding, SlotKey, View
from crossbar.testing import LogCapture

SLOT = ("gpu-a", "m")
CHAT = ("chat", "m")
SECRET = "s3cret"


class FakeLink:
    """A member as the keeper reaches it: what it was told, and its answer to offers."""

    local: bool = False

    def __init__(self, answer: Any = False) -> None:
        self.told: list[tuple[dict[SlotKey, int], dict[Hashable, Head]]] = []
        self.gifts: list[int] = []
        self.offers: list[SlotKey] = []
        self.answer = answer
        self.dropped = False
        self.heard: list[Placed] = []

    def others(self, view: View) -> None:
        self.told.append((dict(view.others.counts), dict(view.others.heads)))
        self.gifts.append(view.gifts)

    def offer(self, slot: SlotKey) -> Any:
        self.offers.append(slot)
        return self.answer() if callable(self.answer) else self.answer

    def drop(self) -> None:
        self.dropped = True

    def placed(self, placed: Any) -> None:
        self.heard.extend(placed)

    @property
    def counts(self) -> dict[SlotKey, int]:
        return self.told[-1][0]


def keeper(*names: str, **answers: Any) -> tuple[Keeper, Clock, dict[str, FakeLink]]:
    clock = Clock()
    found = Keeper(clock)
    links = {name: FakeLink(answers.get(name, False)) for name in names}
    for name, link in links.items():
        found.join(name, link)
    clock.advance(0)
    return found, clock, links


def test_every_member_is_told_the_others_counts_not_its_own() -> None:
    k, clock, links = keeper("w0", "w1", "w2")
    k.report("w1", Holding({SLOT: 2}, {CHAT: (0, 0, 1.0, "f")}))
    k.report("w2", Holding({SLOT: 1}, {}))
    clock.advance(0)
    assert links["w0"].told[-1] == ({SLOT: 3}, {CHAT: (0, 0, 1.0, "f")})
    assert links["w1"].told[-1] == ({SLOT: 1}, {})
    assert links["w2"].told[-1] == ({SLOT: 2}, {CHAT: (0, 0, 1.0, "f")})


def test_members_are_told_once_a_reactor_turn_after_every_change_of_it() -> None:
    k, clock, links = keeper("w0", "w1")
    before = {name: len(link.told) for name, link in links.items()}
    for n in range(1, 6):
        k.report("w1", Holding({SLOT: n}, {}))
    assert {name: len(link.told) for name, link in links.items()} == before  # not yet
    clock.advance(0)
    assert {name: len(link.told) - before[name] for name, link in links.items()} == {
        "w0": 1,
        "w1": 0,  # what w1 is shown did not change: nothing is sent
    }
    assert links["w0"].counts == {SLOT: 5}
    clock.advance(0)
    assert len(links["w0"].told) == before["w0"] + 1  # nothing changed: nothing sent


def test_a_report_or_gift_from_a_stranger_is_ignored() -> None:
    k, clock, links = keeper("w0", "w1")
    k.report("ghost", Holding({SLOT: 4}, {CHAT: (0, 0, 1.0, "f")}))
    k.give("ghost", SLOT, [CHAT], 1)
    clock.advance(0)
    assert links["w0"].counts == {}
    assert links["w0"].offers == links["w1"].offers == []


def test_a_freed_slot_is_offered_to_the_member_whose_request_waits_first() -> None:
    pending: Deferred[bool] = Deferred()
    k, clock, links = keeper("w0", "w1", "w2", w2=lambda: pending)
    k.report("w1", Holding({}, {CHAT: (1, 0, 1.0, "f")}))
    k.report("w2", Holding({}, {CHAT: (0, 5, 9.0, "f")}))  # a better band comes first
    k.give("w0", SLOT, [CHAT], 1)
    assert links["w2"].offers == [SLOT]
    assert links["w1"].offers == []
    clock.advance(0)
    assert links["w0"].counts == links["w1"].counts == {SLOT: 1}  # w2's until it answers
    k.report("w2", Holding({SLOT: 1}, {}))  # its request took it
    pending.callback(True)
    clock.advance(0)
    assert links["w0"].counts == {SLOT: 1}
    assert links["w1"].offers == []


def test_a_given_slot_is_counted_once_as_the_offered_members() -> None:
    k, clock, links = keeper("w0", "w1", "w2", w2=lambda: Deferred())
    k.report("w1", Holding({SLOT: 1}, {}))  # its report still holds the slot it gives
    k.report("w2", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.give("w1", SLOT, [CHAT], 1)
    clock.advance(0)
    assert links["w0"].counts == {SLOT: 1}
    assert k.ledger.held("w1") == 0 and k.ledger.held("w2") == 1


def test_a_slot_no_request_waits_for_is_offered_to_nobody() -> None:
    k, clock, links = keeper("w0", "w1")
    k.report("w1", Holding({}, {("code", None): (0, 0, 1.0, "f")}))
    k.give("w0", SLOT, [CHAT], 1)
    clock.advance(0)
    assert links["w1"].offers == []
    assert links["w0"].counts == {}


def test_a_member_that_passes_the_slot_on_hands_it_to_the_next() -> None:
    k, clock, links = keeper("w0", "w1", "w2", w1=False, w2=True)
    k.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.report("w2", Holding({}, {CHAT: (0, 0, 2.0, "f")}))
    k.give("w0", SLOT, [CHAT], 1)
    assert links["w1"].offers == [SLOT]
    assert links["w2"].offers == [SLOT]
    clock.advance(0)
    assert links["w0"].counts == {}  # w2 counts it once it reports it, as it does at once


def test_a_failed_offer_goes_to_the_next_member() -> None:
    k, _, links = keeper("w0", "w1", "w2", w1=lambda: fail(ConnectionError("gone")), w2=True)
    k.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.report("w2", Holding({}, {CHAT: (0, 0, 2.0, "f")}))
    k.give("w0", SLOT, [CHAT], 1)
    assert links["w2"].offers == [SLOT]


def test_an_offer_raising_at_once_goes_to_the_next_member() -> None:
    def broken() -> bool:
        raise RuntimeError("broken link")

    k, _, links = keeper("w0", "w1", "w2", w1=broken, w2=True)
    k.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.report("w2", Holding({}, {CHAT: (0, 0, 2.0, "f")}))
    k.give("w0", SLOT, [CHAT], 1)
    assert links["w2"].offers == [SLOT]


def test_an_offer_unanswered_for_the_timeout_goes_to_the_next_member() -> None:
    silent: Deferred[bool] = Deferred()
    k, clock, links = keeper("w0", "w1", "w2", w1=lambda: silent, w2=True)
    k.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.report("w2", Holding({}, {CHAT: (0, 0, 2.0, "f")}))
    k.give("w0", SLOT, [CHAT], 1)
    clock.advance(OFFER_TIMEOUT - 0.01)
    assert links["w2"].offers == []
    assert links["w0"].counts == {SLOT: 1}  # still counted as w1's
    clock.advance(0.02)
    assert links["w2"].offers == [SLOT]
    clock.advance(0)
    assert links["w0"].counts == {}


def test_when_everyone_passes_the_slot_is_free() -> None:
    k, clock, links = keeper("w0", "w1", "w2")
    k.report(
        "w0", Holding({}, {CHAT: (0, 0, 3.0, "f")})
    )  # the giver too, when its request comes next
    k.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.report("w2", Holding({}, {CHAT: (0, 0, 2.0, "f")}))
    k.give("w0", SLOT, [CHAT], 1)
    assert [links[n].offers for n in ("w0", "w1", "w2")] == [[SLOT]] * 3
    clock.advance(0)
    assert all(link.counts == {} for link in links.values())


def test_a_member_leaving_frees_its_slots_for_the_others() -> None:
    k, clock, links = keeper("w0", "w1")
    k.report("w1", Holding({SLOT: 3}, {CHAT: (0, 0, 1.0, "f")}))
    clock.advance(0)
    assert links["w0"].counts == {SLOT: 3}
    logs = LogCapture()
    try:
        k.leave("w1", links["w1"])
    finally:
        logs.close()
    clock.advance(0)
    assert links["w0"].told[-1] == ({}, {})
    assert logs.matching("w1 left holding 3 slots")
    assert "w1" not in k.links


def test_a_stale_link_leaving_does_not_drop_the_member_that_joined_again() -> None:
    k, clock, links = keeper("w0", "w1")
    old, new = links["w1"], FakeLink()
    k.join("w1", new)
    assert old.dropped
    k.report("w1", Holding({SLOT: 1}, {}))
    k.leave("w1", old)  # the old connection's close, noticed later
    clock.advance(0)
    assert k.links["w1"] is new
    assert links["w0"].counts == {SLOT: 1}
    assert new.told


def test_a_member_silent_for_a_lease_is_dropped_and_its_slots_freed() -> None:
    k, clock, links = keeper("w0", "w1")
    k.start()
    k.report("w1", Holding({SLOT: 2}, {}))
    logs = LogCapture()
    try:
        for _ in range(int(LEASE / HEARTBEAT) + 2):
            clock.advance(HEARTBEAT)
            k.beat("w0")
    finally:
        logs.close()
        k.stop()
    assert links["w1"].dropped and not links["w0"].dropped
    assert list(k.links) == ["w0"]
    assert links["w0"].counts == {}
    assert logs.matching("w1 was silent for a lease")
    assert not clock.getDelayedCalls()  # stopped: no expiry, no telling left behind


def test_a_name_once_in_process_that_joins_over_a_socket_can_fall_silent() -> None:
    k, clock, _ = keeper()
    local = FakeLink()
    local.local = True
    k.join("w1", local)
    remote = FakeLink()
    k.join("w1", remote)  # the same name, from another process now
    k.start()
    clock.advance(LEASE + HEARTBEAT)
    k.stop()
    assert remote.dropped and "w1" not in k.links


def test_a_heartbeat_from_a_stranger_is_ignored() -> None:
    k, _, _ = keeper("w0")
    k.beat("ghost")
    assert k.ledger.members() == ["w0"]


def test_the_giver_is_told_which_of_its_gifts_the_counts_include() -> None:
    pending: Deferred[bool] = Deferred()
    k, clock, links = keeper("w0", "w1", "w2", w2=lambda: pending)
    k.report("w2", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    k.give("w1", SLOT, [CHAT], 7)
    clock.advance(0)
    assert links["w1"].told[-1][0] == {SLOT: 1}  # offered to w2: held elsewhere
    assert links["w1"].gifts[-1] == 7
    assert links["w0"].gifts[-1] == 0  # it gave nothing


def test_a_worker_that_joins_again_is_told_it_has_given_nothing_yet() -> None:
    k, clock, links = keeper("w0", "w1")
    k.give("w1", SLOT, [CHAT], 5)
    fresh = FakeLink()
    k.join("w1", fresh)  # restarted: its old connection not closed yet
    clock.advance(0)
    assert links["w1"].dropped
    assert fresh.gifts[-1] == 0


# -- over AMP ---------------------------------------------------------------------------------


class Peer(amp.AMP):
    """Another worker's end, as plain as it gets: it records what it is told."""

    def __init__(self, took: bool = True) -> None:
        super().__init__()
        self.told: list[tuple[str, str]] = []
        self.took = took
        self.lost = False

    @wire.Others.responder
    def others(self, counts: str, heads: str, flows: str, gifts: int) -> dict[str, Any]:
        self.told.append((counts, heads))
        return {}

    @wire.Offer.responder
    def offer(self, slot: str) -> dict[str, Any]:
        return {"took": self.took}

    def connectionLost(self, reason: Any) -> None:  # type: ignore[override]
        super().connectionLost(reason)
        self.lost = True


def connected(k: Keeper, clock: Clock, took: bool = True) -> tuple[Peer, Any]:
    server = KeeperFactory(k, SECRET).buildProtocol(None)
    peer = Peer(took)
    pump = iosim.connect(
        server,
        iosim.FakeTransport(server, isServer=True),
        peer,
        iosim.FakeTransport(peer, isServer=False),
        greet=False,
        clock=clock,
    )
    return peer, pump


def test_a_worker_with_the_secret_joins_and_reports_over_amp() -> None:
    k, clock, links = keeper("w0")
    peer, pump = connected(k, clock)
    joined = peer.callRemote(wire.Join, name="w1", secret=SECRET)
    pump.flush()
    assert joined.called and "w1" in k.links
    peer.callRemote(wire.Report, counts=wire.dump_counts({SLOT: 2}), heads="[]", flows="[]")
    pump.flush()
    assert links["w0"].counts == {SLOT: 2}


def test_a_wrong_secret_closes_the_connection_and_joins_nothing() -> None:
    k, clock, _ = keeper("w0")
    peer, pump = connected(k, clock)
    answers: list[Any] = []
    peer.callRemote(wire.Join, name="w1", secret="guess").addBoth(answers.append)
    pump.flush()
    assert peer.lost
    assert answers and not isinstance(answers[0], dict)  # no welcome
    assert list(k.links) == ["w0"]
    assert k.ledger.members() == ["w0"]


def test_before_joining_a_connection_counts_and_gives_nothing() -> None:
    k, clock, links = keeper("w0", w0=True)
    k.report("w0", Holding({}, {CHAT: (0, 0, 1.0, "f")}))
    peer, pump = connected(k, clock)
    peer.callRemote(wire.Report, counts=wire.dump_counts({SLOT: 2}), heads="[]", flows="[]")
    gift = {"slot": wire.dump_slot(*SLOT), "pools": wire.dump_pools([CHAT])}
    peer.callRemote(wire.Give, gift=1, **gift)
    pump.flush()
    assert links["w0"].counts == {}
    assert links["w0"].offers == []
    assert not peer.lost


def test_a_worker_is_told_the_others_and_answers_offers_over_amp() -> None:
    k, clock, links = keeper("w0")
    peer, pump = connected(k, clock, took=True)
    peer.callRemote(wire.Join, name="w1", secret=SECRET)
    heads = wire.dump_heads({CHAT: (0, 0, 1.0, "f")})
    peer.callRemote(wire.Report, counts="[]", heads=heads, flows="[]")
    pump.flush()
    k.report("w0", Holding({SLOT: 1}, {}))
    pump.flush()
    assert wire.load_counts(peer.told[-1][0]) == {SLOT: 1}
    k.give("w0", SLOT, [CHAT], 1)
    pump.flush()
    assert links["w0"].offers == []  # w1 took it
    assert k.ledger.held("w1") == 0  # answered: counted once w1 reports it


def test_a_connection_closing_frees_what_its_worker_held() -> None:
    k, clock, links = keeper("w0")
    peer, pump = connected(k, clock)
    peer.callRemote(wire.Join, name="w1", secret=SECRET)
    peer.callRemote(wire.Report, counts=wire.dump_counts({SLOT: 2}), heads="[]", flows="[]")
    pump.flush()
    assert links["w0"].counts == {SLOT: 2}
    assert peer.transport is not None
    peer.transport.loseConnection()
    pump.flush()
    assert "w1" not in k.links
    assert links["w0"].counts == {}


def test_abort_closes_a_transport_that_can_and_ignores_one_that_cannot() -> None:
    closed: list[bool] = []

    class Transport:
        def abortConnection(self) -> None:
            closed.append(True)

    abort(Transport())
    abort(None)
    abort(object())
    assert closed == [True]


def test_the_factory_builds_a_connection_with_the_runs_secret() -> None:
    k, _, _ = keeper()
    built = KeeperFactory(k, SECRET).buildProtocol(None)
    assert isinstance(built, KeeperProtocol)
    assert built.keeper is k and built.name is None


def test_a_placement_is_told_to_every_other_member_and_to_one_that_joins_while_it_is_live() -> None:
    found, clock, links = keeper("w0", "w1", "w2")
    a, b = Placed(bytes(16), "gpu-a", 0), Placed(bytes([1] * 16), "gpu-b", 2)
    found.place("w1", [a])
    assert links["w0"].heard == [a] and links["w2"].heard == [a] and links["w1"].heard == []
    found.place("gone", [b])  # not a member: nothing
    assert links["w0"].heard == [a]
    clock.advance(LIVE_SECONDS - 10)
    found.place("w2", [b])
    clock.advance(20)  # a is no longer live, b is
    late = FakeLink()
    found.join("w3", late)
    assert late.heard == []  # not before its join is answered
    clock.advance(0)
    assert [(p.key, p.host, p.turn, p.age) for p in late.heard] == [(b.key, "gpu-b", 2, 20.0)]


def test_worker_0_keeps_so_many_placements_at_most(monkeypatch: Any) -> None:
    monkeypatch.setattr("crossbar.sharing.keeper.MOST_KEPT", 3)
    found, _, _ = keeper("w0")
    found.place("w0", [Placed(n.to_bytes(16, "big"), "gpu-a", 0) for n in range(5)])
    assert [int.from_bytes(k, "big") for k in found.placements] == [2, 3, 4]

"""crossbar.sharing.links: worker 0's member in-process, the other workers over AMP (in
memory here): a worker joins with the secret, reports its counts, and is told the others';
a worker 0 that stops answering heartbeats is dropped; the port is read where it is
published."""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.error import ConnectError
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.test import iosim

from crossbar.queueing import Head, Traffic
from crossbar.routing import Conversations
from crossbar.sharing import joining, keeping
from crossbar.sharing.keeper import Keeper, KeeperFactory
from crossbar.sharing.ledger import HEARTBEAT, LEASE, Holding, View
from crossbar.sharing.links import LocalLink, MemberProtocol, _PortFileEndpoint
from crossbar.sharing.member import Member
from crossbar.sharing.placesync import PlacementSync
from crossbar.testing import LogCapture

SECRET = "s3cret"
SLOT = ("gpu-a", "m")
CHAT = ("chat", "m")


class Queue:
    def __init__(self) -> None:
        self.waiting: dict[Any, Head] = {}

    def heads(self) -> dict[Any, Head]:
        return dict(self.waiting)

    def running(self) -> dict[str, int]:
        return {}

    def flow(self, name: str) -> tuple[int, int]:
        return len(self.waiting), 0

    def elsewhere(self, running: dict[str, int]) -> None:
        pass


class Waits:
    """A worker's queue as its member asks it: heads, and offered slots a request takes."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic, self.queue = traffic, Queue()

    def offered(self, host: str, model: str | None) -> bool:
        if not self.queue.waiting:
            return False
        self.queue.waiting.clear()
        self.traffic.move(None, host, model)
        return True


def worker(name: str, clock: Any) -> Member:
    traffic = Traffic(["gpu-a", "gpu-b"], ["chat"], shared=True)
    member = Member(name, traffic, clock)
    traffic.changed = member.changed
    member.waits = Waits(traffic)  # type: ignore[assignment]
    return member


def waiting(member: Member, pool: Any, head: Head) -> None:
    cast(Waits, member.waits).queue.waiting[pool] = head
    member.changed()


def worker_0(clock: Clock) -> tuple[Keeper, Member]:
    keeper = Keeper(clock)
    member = worker("w0", clock)
    link = LocalLink(keeper, member)
    keeper.join("w0", link)
    member.joined(link)
    return keeper, member


def connect(keeper: Keeper, member: Member, clock: Clock, secret: str = SECRET) -> Any:
    server = KeeperFactory(keeper, SECRET).buildProtocol(None)
    client = MemberProtocol(member, secret)
    return iosim.connect(
        server,
        iosim.FakeTransport(server, isServer=True),
        client,
        iosim.FakeTransport(client, isServer=False),
        clock=clock,
    )


def joined_pair(started: bool = False) -> tuple[Clock, Keeper, Member, Member, Any]:
    """Worker 0 (its keeper ``started``: silent members expire) and worker 1, joined."""
    clock = Clock()
    keeper, w0 = worker_0(clock)
    if started:
        keeper.start()
    w1 = worker("w1", clock)
    pump = connect(keeper, w1, clock)
    pump.flush()
    return clock, keeper, w0, w1, pump


def test_a_worker_joins_reports_and_the_others_are_told_its_counts() -> None:
    clock = Clock()
    keeper, w0 = worker_0(clock)
    w1, w2 = worker("w1", clock), worker("w2", clock)
    pumps = [connect(keeper, w1, clock), connect(keeper, w2, clock)]
    for pump in pumps:
        pump.flush()
    assert w1.up and w2.up
    assert sorted(keeper.links) == ["w0", "w1", "w2"]
    w1.traffic.move(None, "gpu-a", "m")
    w1.traffic.move(None, "gpu-a", "m")
    for pump in pumps * 2:
        pump.flush()
    assert w2.traffic.others == {SLOT: 2}
    assert w2.traffic.fleet_busy == {SLOT: 2}
    assert w0.traffic.fleet_in_flight == {"gpu-a": 2, "gpu-b": 0}
    assert w1.traffic.others == {}  # its own are not counted twice


def test_a_freed_slot_goes_over_the_wire_to_the_worker_waiting_first() -> None:
    _clock, keeper, w0, w1, pump = joined_pair()
    waiting(w1, CHAT, (0, 0, 1.0, "f"))
    pump.flush()
    assert w0.waiting()
    w0.traffic.move(None, "gpu-a", "m")
    w0.traffic.move("gpu-a", None, "m")  # its request ends; none of its own waits
    assert w0.owed("gpu-a", "m", [CHAT], [])
    pump.flush()
    assert w1.traffic.busy == {SLOT: 1}  # w1's request took it
    assert w0.traffic.fleet_busy == {SLOT: 1}  # and worker 0 counts it as w1's, once
    assert keeper.ledger.held("w1") == 1


def test_a_worker_with_the_wrong_secret_is_refused_and_counts_alone() -> None:
    clock = Clock()
    keeper, w0 = worker_0(clock)
    w1 = worker("w1", clock)
    pump = connect(keeper, w1, clock, secret="guess")
    pump.flush()
    assert not w1.up
    assert list(keeper.links) == ["w0"]
    assert pump.clientIO.disconnected or pump.serverIO.disconnected
    w1.traffic.move(None, "gpu-a", "m")
    pump.flush()
    assert w0.traffic.others == {}


def test_answered_heartbeats_keep_the_connection_for_many_leases() -> None:
    clock, keeper, _, w1, pump = joined_pair(started=True)
    for _ in range(int(5 * LEASE / HEARTBEAT)):
        clock.advance(HEARTBEAT)
        pump.flush()
    keeper.stop()
    assert w1.up
    assert "w1" in keeper.links


def test_a_worker_0_that_stops_answering_for_a_lease_is_dropped() -> None:
    clock, keeper, _, w1, pump = joined_pair()
    w1.others(View(Holding({SLOT: 3}, {}, {}), 0))
    clock.advance(HEARTBEAT)  # a heartbeat goes out, and nothing comes back
    clock.advance(LEASE - 0.01)
    assert not pump.clientIO.disconnecting
    logs = LogCapture()
    try:
        clock.advance(0.02)
        assert pump.clientIO.disconnecting
        pump.flush()
    finally:
        logs.close()
    assert not w1.up
    assert w1.traffic.fleet_busy == {}  # the others' slots are no longer counted
    assert len(logs.matching("w1", "shared slot count", "lost")) == 1
    assert "w1" not in keeper.links  # worker 0 sees the close too
    assert not clock.getDelayedCalls()  # no heartbeat left running


def test_a_worker_leaving_frees_its_slots_for_the_others() -> None:
    _clock, _keeper, w0, w1, pump = joined_pair()
    w1.traffic.move(None, "gpu-a", "m")
    pump.flush()
    assert w0.traffic.others == {SLOT: 1}
    pump.clientIO.loseConnection()
    pump.flush()
    assert w0.traffic.others == {}
    assert not w1.up


def test_worker_0_is_a_member_in_process() -> None:
    clock = Clock()
    keeper, w0 = worker_0(clock)
    w0.traffic.move(None, "gpu-b", None)
    clock.advance(0)
    assert keeper.ledger.others("w1").counts == {("gpu-b", None): 1}
    keeper.ledger.report("w9", Holding({SLOT: 2}), 0.0)
    keeper.report("w0", Holding())  # a change: everyone is told
    clock.advance(0)
    assert w0.traffic.others == {SLOT: 2}


def test_worker_0_stays_a_member_through_a_quiet_lease() -> None:
    clock, keeper, w0, w1, pump = joined_pair(started=True)
    for _ in range(int(2 * LEASE / HEARTBEAT)):  # w1 beats; worker 0 has nothing to say
        clock.advance(HEARTBEAT)
        pump.flush()
    w1.traffic.move(None, "gpu-a", "m")
    pump.flush()
    keeper.stop()
    assert "w0" in keeper.links
    assert w0.traffic.others == {SLOT: 1}


# -- the services -----------------------------------------------------------------------------


def test_no_published_port_fails_the_connection_attempt() -> None:
    endpoint = _PortFileEndpoint(MemoryReactorClock(), lambda: None)
    failures: list[Any] = []
    endpoint.connect(Factory()).addErrback(failures.append)
    assert failures and failures[0].check(ConnectError)
    assert "not opened" in failures[0].getErrorMessage()


def test_a_published_port_is_reached_on_loopback() -> None:
    reactor = MemoryReactorClock()
    _PortFileEndpoint(reactor, lambda: 41234).connect(Factory())
    assert [(host, port) for host, port, *_ in reactor.tcpClients] == [("127.0.0.1", 41234)]


def test_worker_0_listens_on_loopback_and_publishes_its_port() -> None:
    reactor = MemoryReactorClock()
    w0 = worker("w0", reactor)
    published: list[Any] = []
    service = keeping(reactor, w0, SECRET, published.append)
    assert w0.up  # joined in-process before the port opens
    service.startService()
    assert len(published) == 1
    ((port, factory, _, interface),) = reactor.tcpServers
    assert (port, interface) == (0, "127.0.0.1")
    assert isinstance(factory, KeeperFactory) and factory.secret == SECRET
    service.stopService()
    assert not [call for call in reactor.getDelayedCalls() if call.active()]


def test_another_worker_tries_again_until_worker_0_publishes_its_port() -> None:
    reactor = MemoryReactorClock()
    found: list[int | None] = [None]
    service = joining(reactor, worker("w1", reactor), SECRET, lambda: found[-1])
    service.startService()
    assert reactor.tcpClients == []
    found.append(41234)
    reactor.advance(10)
    assert [(host, port) for host, port, *_ in reactor.tcpClients] == [("127.0.0.1", 41234)]
    transport = StringTransport()
    protocol = reactor.tcpClients[0][2].buildProtocol(None)
    assert protocol is not None
    protocol.makeConnection(transport)
    assert b"Join" in transport.value() and SECRET.encode() in transport.value()
    service.stopService()


def test_a_member_protocol_answers_an_offer_it_cannot_read_with_no() -> None:
    w1 = worker("w1", Clock())
    waiting(w1, CHAT, (0, 0, 1.0, "f"))
    protocol = MemberProtocol(w1, SECRET)
    assert protocol.offered("not json") == {"took": False}
    assert w1.traffic.busy == {}
    assert protocol.offered('["gpu-a", "m"]') == {"took": True}


def test_a_member_protocol_passes_on_what_worker_0_says() -> None:
    w1 = worker("w1", Clock())
    protocol = MemberProtocol(w1, SECRET)
    protocol.makeConnection(StringTransport())
    w1.joined(protocol)  # as once its join is answered
    protocol.told('[["gpu-a", "m", 2]]', '[[["chat", "m"], [0, 0, 1.0, "f"]]]', '[["f", 1]]', 0)
    assert w1.traffic.others == {SLOT: 2}
    assert w1.waiting()


# -- cache_affinity's placements ---------------------------------------------------------------


def placing(name: str, clock: Clock) -> tuple[Member, Conversations]:
    """A worker whose member shares ``cache_affinity``'s placements."""
    member, table = worker(name, clock), Conversations({"gpu-a": 1, "gpu-b": 1})
    member.placements = PlacementSync(table, clock, lambda host: host.startswith("gpu-"))
    return member, table


def test_a_placement_in_one_worker_is_known_in_every_other_and_in_one_that_joins_later() -> None:
    clock = Clock()
    clock.advance(1000)
    keeper = Keeper(clock)
    w0, table0 = placing("w0", clock)
    link = LocalLink(keeper, w0)
    keeper.join("w0", link)
    w0.joined(link)
    w1, table1 = placing("w1", clock)
    pump = connect(keeper, w1, clock)
    pump.flush()
    key = bytes(16)
    placed = table1.place(key, ["gpu-a", "gpu-b"], {}, 1.5, clock.seconds(), turn=0)
    assert placed is not None
    clock.advance(0)  # worker 1 sends its turn's placements
    pump.flush()
    assert table0.host_of(key) == placed.host  # worker 0 heard it from its keeper
    w2, table2 = placing("w2", clock)
    late = connect(keeper, w2, clock)
    late.flush()
    clock.advance(0)  # told once its join is answered
    late.flush()
    assert table2.host_of(key) == placed.host

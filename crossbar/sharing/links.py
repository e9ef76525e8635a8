"""How the workers reach worker 0's keeper: worker 0 in-process, the others over a
loopback connection (Twisted AMP) that a :class:`~twisted.application.internet.ClientService`
keeps open, trying again with a growing pause when worker 0 is not there."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from twisted.application.internet import ClientService, backoffPolicy
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger, LogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer

from crossbar.routing import Placed
from crossbar.sharing import wire
from crossbar.sharing.keeper import Keeper, KeeperFactory, abort
from crossbar.sharing.ledger import HEARTBEAT, LEASE, Holding, SlotKey, View
from crossbar.sharing.member import Member

RETRY = backoffPolicy(initialDelay=0.2, maxDelay=5.0, factor=2.0)
"""The pause before each new try of a lost shared count: 0.2 s, growing to 5 s."""


class QuietClientService(ClientService):
    """A :class:`ClientService` that does not log each try: the member says once that the
    shared count is lost, and once that it is back."""

    _log = Logger(observer=LogPublisher())  # observed by nobody


class LocalLink:
    """Worker 0's member and the keeper, in one process: calls, no socket."""

    local = True

    def __init__(self, keeper: Keeper, member: Member) -> None:
        self.keeper, self.member = keeper, member

    # the keeper's side: reaching the member
    def others(self, view: View) -> None:
        self.member.others(view)

    def offer(self, slot: SlotKey) -> bool:
        return self.member.offer(slot)

    def drop(self) -> None:
        pass  # in this process: never dropped

    def placed(self, placed: Sequence[Placed]) -> None:
        if self.member.placements is not None:
            self.member.placements.heard(placed)

    # the member's side: reaching the keeper
    def report(self, report: Holding) -> None:
        self.keeper.report(self.member.name, report)

    def give(self, slot: SlotKey, pools: Sequence[Hashable], gift: int) -> None:
        self.keeper.give(self.member.name, slot, pools, gift)

    def place(self, placed: Sequence[Placed]) -> Deferred[object]:
        self.keeper.place(self.member.name, placed)
        return succeed(None)


class MemberProtocol(wire.CountConnection):
    """A worker's connection to worker 0: joins, reports, beats, and answers offers."""

    def __init__(self, member: Member, secret: str) -> None:
        super().__init__()
        self.member, self._secret = member, secret
        self._beat = LoopingCall(self._heartbeat)
        self._beat.clock = member.clock

    def connectionMade(self) -> None:
        super().connectionMade()
        joined = self.callRemote(wire.Join, name=self.member.name, secret=self._secret)
        joined.addCallbacks(self._joined, self._refused)

    def _joined(self, _: object) -> None:
        self.member.joined(self)
        self._beat.start(HEARTBEAT, now=False)

    def _refused(self, reason: Failure) -> None:
        abort(self.transport)

    def _heartbeat(self) -> None:
        """Worker 0 must answer within a lease, else it is taken as lost (and tried again)."""
        beat: Deferred[Any] = self.callRemote(wire.Beat)
        beat.addTimeout(LEASE, self.member.clock)
        beat.addErrback(self._silent)

    def _silent(self, reason: Failure) -> None:
        abort(self.transport)

    @wire.Others.responder
    def told(self, counts: str, heads: str, flows: str, gifts: int) -> dict[str, Any]:
        self.member.others(View(wire.load_report(counts, heads, flows), gifts))
        return {}

    @wire.Offer.responder
    def offered(self, slot: str) -> dict[str, Any]:
        key = wire.load_slot(slot)
        return {"took": key is not None and self.member.offer(key)}

    @wire.Place.responder
    def heard(self, placed: str) -> dict[str, Any]:
        if self.member.placements is not None and self.member.uplink is self:
            self.member.placements.heard(wire.load_placed(placed))
        return {}

    def report(self, report: Holding) -> None:
        self.callRemote(wire.Report, **wire.dump_report(report))

    def give(self, slot: SlotKey, pools: Sequence[Hashable], gift: int) -> None:
        gave = {"slot": wire.dump_slot(*slot), "pools": wire.dump_pools(list(pools))}
        self.callRemote(wire.Give, gift=gift, **gave)

    def place(self, placed: Sequence[Placed]) -> Deferred[object]:
        return wire.send_placed(self, placed)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        super().connectionLost(reason)
        if self._beat.running:
            self._beat.stop()
        if self.member.uplink is self:
            self.member.lost(reason.getErrorMessage() or "connection closed")


@implementer(IStreamClientEndpoint)
class _PortFileEndpoint:
    """Worker 0's keeper port on loopback, read where worker 0 wrote it at each try."""

    def __init__(self, reactor: Any, find: Callable[[], int | None]) -> None:
        self.reactor, self.find = reactor, find

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        port = self.find()
        if port is None:
            return fail(ConnectError(string="worker 0 has not opened its slot-count port yet"))
        return TCP4ClientEndpoint(self.reactor, "127.0.0.1", port).connect(factory)


class _Keeping(Service):
    """Worker 0: the keeper's loopback port, its expiry of silent members, its own member."""

    def __init__(
        self, reactor: Any, keeper: Keeper, secret: str, publish: Callable[[IListeningPort], None]
    ) -> None:
        self.reactor, self.keeper, self.secret, self.publish = reactor, keeper, secret, publish
        self.port: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        self.keeper.start()
        endpoint = TCP4ServerEndpoint(self.reactor, 0, interface="127.0.0.1")
        listening = endpoint.listen(KeeperFactory(self.keeper, self.secret))
        listening.addCallback(self._listening)

    def _listening(self, port: IListeningPort) -> None:
        self.port = port
        self.publish(port)

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        self.keeper.stop()
        if self.port is not None:
            return self.port.stopListening()  # type: ignore[return-value]
        return None


def keeping(
    reactor: Any, member: Member, secret: str, publish: Callable[[IListeningPort], None]
) -> Service:
    """Worker 0's service: the keeper, with ``member`` (worker 0's own) joined in-process."""
    keeper = Keeper(reactor)
    link = LocalLink(keeper, member)
    keeper.join(member.name, link)
    member.joined(link)
    return _Keeping(reactor, keeper, secret, publish)


def joining(reactor: Any, member: Member, secret: str, find: Callable[[], int | None]) -> Service:
    """Another worker's service: a connection to worker 0 kept open, tried again when lost."""
    factory = Factory.forProtocol(lambda: MemberProtocol(member, secret))
    service = MultiService()
    QuietClientService(
        _PortFileEndpoint(reactor, find), factory, retryPolicy=RETRY, clock=reactor
    ).setServiceParent(service)
    return service

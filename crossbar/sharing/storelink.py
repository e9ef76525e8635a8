"""How a replica reaches the shared store (``shared_state``): two connections to Redis, one
for the ledger's script and one subscribed to its changes and to the offers made to this
replica, each kept open by a :class:`~twisted.application.internet.ClientService` that
tries again with a growing pause.

The replica is a member of the shared count (:class:`~crossbar.sharing.member.Member`)
while both connections are up: it reports through the script, reads the ledger again on
every change another member publishes and at every heartbeat, and answers each offer; the
placements other members publish are taken from the message, and read again at each beat. A
store that is down, or slower than :data:`REPLY_TIMEOUT`, closes the connections: the
replica counts its own requests only, and joins again once the store answers.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import Any

import txredisapi
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from crossbar.config import SharedState
from crossbar.routing import Placed
from crossbar.sharing.ledger import Holding, SlotKey
from crossbar.sharing.links import RETRY, QuietClientService
from crossbar.sharing.member import Member
from crossbar.sharing.store import (
    Stored,
    StoreLedger,
    changes_channel,
    load_slot,
    offers_channel,
)
from crossbar.sharing.storeplacements import (
    PlacementReads,
    StorePlacements,
    load_published,
    placed_channel,
)

log = Logger()

REPLY_TIMEOUT = 1.0
"""Seconds the store has to answer a call; a slower store is taken as lost."""
BEAT = 1.0
"""Seconds between two heartbeats of a member, each also a fresh read of the ledger. Each
call to the store drops the members whose lease ran out, so a dead replica's slots are
free at most a lease and a beat after its last word."""


class StoreLink:
    """A member's way to the store: the :class:`~crossbar.sharing.member.Uplink` while up."""

    def __init__(self, member: Member, reactor: Any) -> None:
        self.member, self.reactor = member, reactor
        self.placements: StorePlacements | None = None
        """``cache_affinity``'s placements in the store, while the command connection is
        open (when the member shares them)."""
        self.reads: PlacementReads | None = None
        self.ledger: StoreLedger | None = None
        """The ledger over the command connection, while it is open."""
        self.commands: txredisapi.RedisProtocol | None = None
        self.subscription: txredisapi.SubscriberProtocol | None = None
        self.listening = False
        """Subscribed to the changes and to this member's offers."""
        self._reading, self._again = False, False
        self._beat = LoopingCall(self._heartbeat)
        self._beat.clock = reactor

    @property
    def name(self) -> str:
        return self.member.name

    # -- the connections -------------------------------------------------------------------

    def opened(self, commands: txredisapi.RedisProtocol) -> None:
        self.commands, self.ledger = commands, StoreLedger(commands)
        if self.member.placements is not None:
            self.placements = StorePlacements(commands)
            heard = self.member.placements.heard
            self.reads = PlacementReads(self.name, self.placements, heard, self._failed)
        self._join()

    def subscribing(self, subscription: txredisapi.SubscriberProtocol) -> None:
        self.subscription = subscription
        channels = [changes_channel(), offers_channel(self.name)]
        if self.member.placements is not None:
            channels.append(placed_channel())
        subscription.subscribe(channels).addCallbacks(self._subscribed, self._failed)

    def _subscribed(self, _: object) -> None:
        self.listening = True
        self._join()

    def _join(self) -> None:
        if self.ledger is None or not self.listening or self.member.uplink is self:
            return
        self.member.joined(self)
        self._read()
        self._read_placements()
        if not self._beat.running:
            self._beat.start(BEAT, now=False)

    def closed(self, connection: object) -> None:
        """Either connection closed: the member counts its own until both are back."""
        if connection is self.commands:
            self.commands = self.ledger = self.placements = None
            if self.reads is not None:
                self.reads.stopped, self.reads = True, None
        elif connection is self.subscription:
            self.subscription, self.listening = None, False
        else:
            return
        self._down("its connection closed")

    def _down(self, why: str) -> None:
        if self._beat.running:
            self._beat.stop()
        if self.member.uplink is self:
            self.member.lost(why)

    def _failed(self, failure: Failure) -> None:
        """A call failed or timed out: both connections are closed, to be opened again."""
        why = failure.getErrorMessage() or type(failure.value).__name__
        for connection in (self.commands, self.subscription):
            if connection is not None and connection.transport is not None:
                connection.transport.abortConnection()
        self._down(why)

    # -- the member's side (Uplink) ---------------------------------------------------------

    def report(self, report: Holding) -> None:
        if self.ledger is not None:
            self.ledger.report(self.name, report).addErrback(self._failed)

    def give(self, slot: SlotKey, pools: Sequence[Hashable], gift: int) -> None:
        if self.ledger is not None:
            gave = self.ledger.give(self.name, slot, pools, gift)
            gave.addCallbacks(lambda _: self._read(), self._failed)

    def place(self, placed: Sequence[Placed]) -> Deferred[object]:
        if self.placements is None:
            return succeed(None)
        return self.placements.put(self.name, placed).addErrback(self._failed)

    # -- what the store says ----------------------------------------------------------------

    def heard(self, channel: str, message: str) -> None:
        """A message on a subscribed channel: a change by another member, or an offer."""
        if channel == changes_channel():
            if message != self.name:
                self._read()
        elif channel == offers_channel(self.name):
            self._offered(message)
        elif channel == placed_channel() and self.member.placements is not None:
            self.member.placements.heard(load_published(message, self.name))

    def _offered(self, message: str) -> None:
        """An offer: the ledger is read first (so that the offered slot is free in this
        member's counts, as the giver's report no longer holds it), then answered."""
        try:
            offer = json.loads(message) if len(message) <= 4096 else None
        except (ValueError, RecursionError):
            return
        if not isinstance(offer, dict) or not isinstance(offer.get("id"), str):
            return
        slot = load_slot(offer.get("slot"))
        if self.ledger is not None:
            read = self.ledger.read()
            read.addCallback(lambda stored: self._answer(stored, offer["id"], slot))
            read.addErrback(self._failed)

    def _answer(self, stored: Stored, offer: str, slot: SlotKey | None) -> None:
        self._view(stored)
        took = slot is not None and self.member.uplink is self and self.member.offer(slot)
        if self.ledger is not None:  # its report (in member.offer) went first, on this connection
            self.ledger.answer(self.name, offer, took).addErrback(self._failed)

    def _read(self) -> None:
        """Read the ledger now (once more after, if it changes meanwhile)."""
        if self.ledger is None:
            return
        if self._reading:
            self._again = True
            return
        self._reading = True
        self.ledger.read().addCallbacks(self._view, self._failed).addBoth(self._read_done)

    def _read_done(self, _: object) -> None:
        self._reading = False
        if self._again:
            self._again = False
            self._read()

    def _view(self, stored: Stored) -> None:
        if self.member.uplink is self:
            self.member.others(stored.view(self.name))

    def _heartbeat(self) -> None:
        if self.ledger is not None:
            self.ledger.beat(self.name).addCallbacks(self._beaten, self._failed)

    def _beaten(self, known: bool) -> None:
        if not known and self.member.uplink is self:  # dropped (a lease ran out, or a new store)
            self.member.joined(self)
        self._read()
        self._read_placements()

    def _read_placements(self) -> None:
        if self.reads is not None and self.member.uplink is self:
            self.reads.read()

    def leave(self) -> Deferred[Any] | None:
        """On stopping: what this member holds is free at once, not after a lease."""
        if self._beat.running:
            self._beat.stop()
        if self.ledger is None:
            return None
        return self.ledger.leave(self.name).addErrback(lambda _: None)


class _Subscription(txredisapi.SubscriberProtocol):  # type: ignore[misc]
    link: StoreLink

    def messageReceived(self, pattern: object, channel: object, message: object) -> None:
        if isinstance(channel, str) and isinstance(message, str):
            self.link.heard(channel, message)


class _Connections(Factory):
    """Builds one of the link's two connections for a ClientService (which reconnects);
    what ``txredisapi``'s protocol asks of its factory is here too."""

    noisy = False
    isLazy = True

    def __init__(self, link: StoreLink, state: SharedState, subscribe: bool) -> None:
        self.link, self.state, self.subscribe = link, state, subscribe
        self._refusal: str | None = None

    def buildProtocol(self, addr: Any) -> Any:
        kind = _Subscription if self.subscribe else txredisapi.RedisProtocol
        password = None if self.state.password is None else self.state.password.value.decode()
        connection = kind(
            charset="utf-8",
            replyTimeout=REPLY_TIMEOUT,
            password=password,
            dbid=self.state.db,
            convertNumbers=False,
            username=self.state.username,
        )
        connection.factory = self
        if self.subscribe:
            connection.link = self.link
        ready = self.link.subscribing if self.subscribe else self.link.opened
        connection.whenConnected().addCallback(ready)
        connection.whenDisconnected().addCallback(self.link.closed)
        return connection

    def stopTrying(self) -> None:
        """The store refused the password or database: tried again, with the pause."""

    def connectionError(self, message: str) -> None:
        if message != self._refusal:
            self._refusal = message
            log.warn(
                "the shared store {store} refused crossbar: {why}",
                store=self.state.shown,
                why=message,
            )


class _Storing(MultiService):
    def __init__(self, link: StoreLink) -> None:
        super().__init__()
        self.link = link

    def stopService(self) -> Deferred[None]:
        left = self.link.leave()
        stopping = super().stopService
        if left is None:
            return stopping()  # type: ignore[no-any-return]
        return left.addBoth(lambda _: stopping())


def storing(reactor: Any, member: Member, state: SharedState) -> MultiService:
    """A replica's service: its member joined to the store, as long as the store answers."""
    link = StoreLink(member, reactor)
    service = _Storing(link)
    endpoint = HostnameEndpoint(reactor, state.host, state.port, timeout=REPLY_TIMEOUT * 5)
    for subscribe in (False, True):
        factory = _Connections(link, state, subscribe)
        QuietClientService(endpoint, factory, retryPolicy=RETRY, clock=reactor).setServiceParent(
            service
        )
    return service

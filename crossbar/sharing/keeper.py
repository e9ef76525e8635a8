"""Worker 0's side of the shared slot count: the ledger, fed by every worker's reports,
each worker told the others' counts, and each freed slot that is owed elsewhere offered to
the worker whose request waits first.

Worker 0 is a member too, through :class:`LocalLink` (no socket); the others connect to a
loopback port (:class:`KeeperFactory`) and speak :mod:`crossbar.sharing.wire`. What each
worker is told is sent at most once a reactor turn, after every change of that turn.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from crossbar.routing import LIVE_SECONDS, Placed
from crossbar.sharing import wire
from crossbar.sharing.ledger import HEARTBEAT, Holding, SlotKey, SlotLedger, View

log = Logger()

MOST_KEPT = 4096
"""Conversations' placements worker 0 keeps for workers that join later, at most."""
OFFER_TIMEOUT = 2.0
"""Seconds a worker has to answer an offer; then the slot goes to the next one waiting."""


class Link(Protocol):
    """How the keeper reaches one member."""

    local: bool
    """In worker 0's own process: never dropped for silence."""

    def others(self, view: View) -> None: ...
    def offer(self, slot: SlotKey) -> bool | Deferred[bool]: ...
    def drop(self) -> None: ...
    def placed(self, placed: Sequence[Placed]) -> None: ...


class Keeper:
    """The ledger and the members' links: what to tell whom, and where a freed slot goes."""

    def __init__(self, clock: IReactorTime, ledger: SlotLedger | None = None) -> None:
        self.clock = clock
        self.ledger = ledger if ledger is not None else SlotLedger()
        self.links: dict[str, Link] = {}
        self.gifts: dict[str, int] = {}
        """Each member's last gift (:meth:`give`): what it is told it counts as held."""
        self.told: dict[str, View] = {}
        """What each member was last told."""
        self.placements: OrderedDict[bytes, tuple[Placed, float]] = OrderedDict()
        """The latest placement of each conversation (at most :data:`MOST_KEPT`), with
        when it came: a worker that joins later is told the live ones."""
        self._due: IDelayedCall | None = None
        self._expiry = LoopingCall(self._expire)
        self._expiry.clock = clock

    def start(self) -> None:
        self._expiry.start(HEARTBEAT, now=False)

    def stop(self) -> None:
        if self._expiry.running:
            self._expiry.stop()
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None

    def join(self, name: str, link: Link) -> None:
        """Member ``name`` joins (a worker that restarted replaces its old link)."""
        old = self.links.pop(name, None)
        if old is not None and old is not link:
            old.drop()
        self.gifts.pop(name, None)  # a new process numbers its gifts from 1
        self.told.pop(name, None)
        self.ledger.join(name, self.clock.seconds())
        self.links[name] = link
        self._changed()
        if self.placements:  # told after its join is answered
            self.clock.callLater(0, self._tell_placed, name, link)

    def _tell_placed(self, name: str, link: Link) -> None:
        """A member that joined is told the live placements the others made."""
        if self.links.get(name) is not link:
            return
        now = self.clock.seconds()
        live = [
            attrs.evolve(one, age=now - when)
            for one, when in self.placements.values()
            if now - when < LIVE_SECONDS
        ]
        if live:
            link.placed(live)

    def place(self, name: str, placed: Sequence[Placed]) -> None:
        """Member ``name`` placed these: every other member is told."""
        if name not in self.links:
            return
        now, kept = self.clock.seconds(), self.placements
        for one in placed:
            kept.pop(one.key, None)
            kept[one.key] = (one, now)
        while len(kept) > MOST_KEPT:
            kept.popitem(last=False)
        for other, link in self.links.items():
            if other != name:
                link.placed(placed)

    def leave(self, name: str, link: Link) -> None:
        """Member ``name`` left (its connection closed): what it held is free at once."""
        if self.links.get(name) is link:
            del self.links[name]
            self._forget(name)
            held = self.ledger.held(name)
            self.ledger.leave(name)
            if held:
                log.info("{name} left holding {held} slots: they are free", name=name, held=held)
            self._changed()

    def _forget(self, name: str) -> None:
        """What the keeper kept of member ``name``, besides the ledger, once it is gone."""
        self.gifts.pop(name, None)
        self.told.pop(name, None)

    def report(self, name: str, report: Holding) -> None:
        if name in self.links:
            self.ledger.report(name, report, self.clock.seconds())
            self._changed()

    def beat(self, name: str) -> None:
        if name in self.links:
            self.ledger.seen(name, self.clock.seconds())

    def give(self, name: str, slot: SlotKey, pools: Sequence[Hashable], gift: int) -> None:
        """Member ``name`` freed ``slot`` (its gift number ``gift``), owed to a request
        waiting elsewhere: offer it."""
        if name in self.links:
            self.gifts[name] = gift
            self.ledger.give(name, slot)
            self._offer(slot, list(pools), [])

    def _offer(self, slot: SlotKey, pools: list[Hashable], passed: list[str]) -> None:
        """Offer ``slot`` to the member whose request waits first (the giver too, whose
        report came before its gift), past those in ``passed``, until one takes it."""
        target = self.ledger.offer(slot, pools, passed)
        self._changed()
        if target is None:
            return  # nobody waits for it: free, as everyone is told
        self._tell(target)  # its view of the slots first: the offered one is free to it
        asked = maybeDeferred(self.links[target].offer, slot)
        if not asked.called:
            asked.addTimeout(OFFER_TIMEOUT, self.clock)

        def answered(took: object) -> None:
            self.ledger.answered(target, slot)
            self._changed()
            if took is not True:
                self._offer(slot, pools, [*passed, target])

        asked.addBoth(answered)

    def _changed(self) -> None:
        if self._due is None:
            self._due = self.clock.callLater(0, self._tell_all)

    def _tell_all(self) -> None:
        self._due = None
        for name in list(self.links):
            self._tell(name)

    def _tell(self, name: str) -> None:
        """Member ``name`` is told the others' counts, heads and flows in flight."""
        view = View(self.ledger.others(name), self.gifts.get(name, 0))
        if self.told.get(name) != view:  # the same word again is not sent
            self.told[name] = view
            self.links[name].others(view)

    def _expire(self) -> None:
        """Members silent for a lease are dropped, and their connections closed."""
        now = self.clock.seconds()
        for name, member in self.links.items():
            if member.local:  # worker 0's own, in this process: never silent
                self.ledger.seen(name, now)
        for name in self.ledger.expired(now):
            gone = self.links.pop(name, None)
            self._forget(name)
            log.warn("{name} was silent for a lease: its slots are free", name=name)
            if gone is not None:
                gone.drop()
            self._changed()


class KeeperProtocol(wire.CountConnection):
    """One worker's connection to worker 0."""

    local = False

    def __init__(self, keeper: Keeper, secret: str) -> None:
        super().__init__()
        self.keeper, self._secret = keeper, secret
        self.name: str | None = None

    @wire.Join.responder
    def joined(self, name: str, secret: str) -> dict[str, Any]:
        if not hmac.compare_digest(secret.encode(), self._secret.encode()):
            abort(self.transport)
            raise PermissionError("wrong secret")
        self.name = name
        self.keeper.join(name, self)
        return {}

    @wire.Report.responder
    def reported(self, counts: str, heads: str, flows: str) -> dict[str, Any]:
        if self.name is not None:
            self.keeper.report(self.name, wire.load_report(counts, heads, flows))
        return {}

    @wire.Give.responder
    def given(self, slot: str, pools: str, gift: int) -> dict[str, Any]:
        key = wire.load_slot(slot)
        if self.name is not None and key is not None:
            self.keeper.give(self.name, key, wire.load_pools(pools), gift)
        return {}

    @wire.Place.responder
    def placing(self, placed: str) -> dict[str, Any]:
        if self.name is not None:
            self.keeper.place(self.name, wire.load_placed(placed))
        return {}

    @wire.Beat.responder
    def beaten(self) -> dict[str, Any]:
        if self.name is not None:
            self.keeper.beat(self.name)
        return {}

    def others(self, view: View) -> None:
        self.callRemote(wire.Others, gifts=view.gifts, **wire.dump_report(view.others))

    def offer(self, slot: SlotKey) -> Deferred[bool]:
        asked: Deferred[Any] = self.callRemote(wire.Offer, slot=wire.dump_slot(*slot))
        return asked.addCallback(lambda answer: bool(answer["took"]))

    def drop(self) -> None:
        abort(self.transport)

    def placed(self, placed: Sequence[Placed]) -> None:
        wire.send_placed(self, placed)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        super().connectionLost(reason)
        if self.name is not None:
            self.keeper.leave(self.name, self)


def abort(transport: object) -> None:
    """Close a connection at once (its peer is dead, refused, or stopped answering)."""
    closing = getattr(transport, "abortConnection", None)
    if closing is not None:
        closing()


class KeeperFactory(Factory):
    """Worker 0's loopback port for the other workers."""

    noisy = False

    def __init__(self, keeper: Keeper, secret: str) -> None:
        self.keeper, self.secret = keeper, secret

    def logPrefix(self) -> str:
        return "crossbar slot count"

    def buildProtocol(self, addr: Any) -> KeeperProtocol:
        return KeeperProtocol(self.keeper, self.secret)

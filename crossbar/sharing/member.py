"""A worker's side of the shared slot count (``workers: N``): it tells worker 0 what it
holds and has waiting, adds what the others hold to its own counts, and hands a slot it
frees to another worker when a request waits there first.

Without worker 0 (before the first connection, or once it is lost) a worker counts its
own requests only, as one crossbar alone does, and says so once in the log and in
``crossbar_shared_count_up``; it comes back on its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from crossbar.queueing import Head, Traffic, Waits
from crossbar.routing import Placed
from crossbar.sharing.ledger import Holding, Order, SlotKey, View
from crossbar.sharing.placesync import PlacementSync

log = Logger()


class Uplink(Protocol):
    """How a member reaches worker 0 (or the shared store)."""

    def report(self, report: Holding) -> None: ...
    def give(self, slot: SlotKey, pools: Sequence[Hashable], gift: int) -> None: ...
    def place(self, placed: Sequence[Placed]) -> Deferred[object]: ...


class Member:
    """One worker's view of the others: a :class:`~crossbar.queueing.SlotShare`."""

    def __init__(
        self,
        name: str,
        traffic: Traffic,
        clock: IReactorTime,
        keeper: str = "worker 0",
        placements: PlacementSync | None = None,
    ) -> None:
        self.name, self.traffic, self.clock = name, traffic, clock
        self.keeper = keeper
        """Who keeps the count, as the log names it: worker 0, or the shared store."""
        self.placements = placements
        """``cache_affinity``'s placements, shared with the others while joined."""
        self.waits: Waits | None = None
        """Set once built (the queue is given this member when it is made)."""
        self.uplink: Uplink | None = None
        self._others = Holding()
        """The other workers' slots, first requests and flows in flight, as worker 0 last
        told."""
        self._gifts: list[tuple[int, SlotKey]] = []
        """Slots given to worker 0 that its last word did not count yet: counted as held
        elsewhere meanwhile, so that no request of this worker takes one in between."""
        self._gift = 0
        self._due: IDelayedCall | None = None
        self._reported: Holding | None = None
        """What worker 0 was last told (a report that would say the same is not sent)."""
        self._lost_said = False

    @property
    def up(self) -> bool:
        """Whether worker 0 is heard now (else this worker counts its own only)."""
        return self.uplink is not None

    # -- what the queue asks (SlotShare) ------------------------------------------------------

    def waiting(self) -> bool:
        return bool(self._others.heads)

    def ahead(self, pools: Sequence[Hashable], head: Head) -> bool:
        heads, order = self._others.heads, self._order(head)
        return any(p in heads and self._order(heads[p]) < order for p in pools)

    def owed(
        self, host: str, model: str | None, pools: Sequence[Hashable], mine: Sequence[Head]
    ) -> bool:
        heads = self._others.heads
        first = min((self._order(heads[p]) for p in pools if p in heads), default=None)
        if first is None or any(self._order(head) <= first for head in mine):
            return False
        return self.hand_over(host, model, pools)

    def hand_over(self, host: str, model: str | None, pools: Sequence[Hashable]) -> bool:
        uplink = self.uplink
        if uplink is None:
            return False
        self._gift += 1  # held elsewhere, as this worker counts, until worker 0 has counted it
        self._gifts.append((self._gift, (host, model)))
        self._count()
        uplink.give((host, model), pools, self._gift)
        return True

    def changed(self) -> None:
        if self.uplink is not None and self._due is None:
            self._due = self.clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Tell worker 0 this worker's counts and waiting heads now."""
        if self._due is not None:
            if self._due.active():
                self._due.cancel()
            self._due = None
        if self.uplink is not None:
            queue = self.waits.queue if self.waits is not None else None
            heads, flows = (queue.heads(), queue.running()) if queue is not None else ({}, {})
            report = Holding(dict(self.traffic.busy), heads, flows)
            if report != self._reported:  # a request that came and went in one turn: nothing
                self._reported = report
                self.uplink.report(report)

    def _order(self, head: Head) -> Order:
        """A head (this worker's or another's) as the fleet orders it: its flow's requests
        in flight here now, and in the other workers as worker 0 last told."""
        band, _, arrived, flow = head
        here = self.waits.queue.flow(flow)[1] if self.waits is not None else 0
        return band, here + self._others.flows.get(flow, 0), arrived

    # -- what worker 0 says --------------------------------------------------------------------

    def others(self, view: View) -> None:
        """Worker 0's word: the others' slots, first requests and flows in flight, counting
        this worker's gifts up to number ``view.gifts``."""
        if self.uplink is not None:
            self._others = view.others
            self._gifts = [(n, slot) for n, slot in self._gifts if n > view.gifts]
            self._count()
            if self.waits is not None:
                self.waits.queue.elsewhere(view.others.flows)

    def _count(self) -> None:
        """The traffic counts the others' slots, and the gifts worker 0 has not counted yet."""
        counts = self._others.counts
        if self._gifts:
            counts = dict(counts)
            for _, slot in self._gifts:
                counts[slot] = counts.get(slot, 0) + 1
        self.traffic.set_others(counts)

    def offer(self, slot: SlotKey) -> bool:
        """A slot freed in another worker: a request waiting here takes it, or none does."""
        took = self.waits is not None and self.waits.offered(*slot)
        self.flush()  # its count first, then the answer
        return took

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """``crossbar_shared_count_up``: 1 while worker 0's count is heard, for /metrics."""
        yield GaugeMetricFamily(
            "crossbar_shared_count_up",
            "Whether this process counts the other processes' slots (1) or its own only (0)",
            value=1 if self.up else 0,
        )

    # -- worker 0 found and lost ---------------------------------------------------------------

    def joined(self, uplink: Uplink) -> None:
        self.uplink, self._reported = uplink, None
        if self._lost_said:
            log.info("{name}: the shared slot count is back", name=self.name)
            self._lost_said = False
        self.flush()
        if self.placements is not None:
            self.placements.start(uplink.place)

    def lost(self, why: str) -> None:
        """Worker 0 is not heard: count this worker's requests only, until it is back."""
        self.uplink = None
        self._others, self._gifts = Holding(), []
        self.traffic.set_others({})
        if self.waits is not None:
            self.waits.queue.elsewhere({})
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None
        if self.placements is not None:
            self.placements.stop()
        if not self._lost_said:
            log.warn(
                "{name}: the shared slot count ({keeper}) is lost ({why}): counting this "
                "process's requests only until it is back",
                name=self.name,
                keeper=self.keeper,
                why=why,
            )
            self._lost_said = True

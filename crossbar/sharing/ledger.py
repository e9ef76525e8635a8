"""The fleet's count of slots in use, kept by worker 0 for every worker (``workers: N``).

Each worker (a *member*) reports (:class:`Holding`) what it has in flight per host and
model and per flow, and the head of each pool it has requests waiting in (a
:data:`~crossbar.queueing.Head`: band, the flow's requests in flight there, when it came,
the flow); across workers, heads are compared by :data:`Order`. A member is shown the
others' counts, added to its own when it asks whether a host is full, and the others'
best heads, so that it knows when a slot it frees is owed to a request waiting elsewhere.
Then it gives the slot here, and the ledger *offers* it to the member whose head is first,
counting the slot as that member's until it answers (it takes it, or passes it on).

A member that stops reporting for a lease (:data:`LEASE`) is dropped with everything it
counted, as is one that disconnects. Pure: every call is given the time.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

import attrs

from crossbar.queueing.lanes import Head

LEASE = 10.0
"""Seconds a member may go without reporting before its counts are dropped: a member
reports at least every third of it (:data:`HEARTBEAT`), and at once on every change."""
HEARTBEAT = LEASE / 3

SlotKey = tuple[str, "str | None"]
"""A host and a model: what a slot is counted against (a model's slots are its own)."""
Order = tuple[int, int, float]
"""A head as compared across workers: band, its flow's requests in flight in every
worker, when it came. Smaller goes first."""


@attrs.frozen
class Holding:
    """What a member tells worker 0 (or worker 0 a member, of all the others together)."""

    counts: Mapping[SlotKey, int] = attrs.field(factory=dict)
    """Requests in flight per host and model (none at 0)."""
    heads: Mapping[Hashable, Head] = attrs.field(factory=dict)
    """The first waiting request of each pool (the first by :data:`Order`, of several)."""
    flows: Mapping[str, int] = attrs.field(factory=dict)
    """Each flow's requests in flight (none at 0)."""


@attrs.frozen
class View:
    """What worker 0 tells a member: the others' :class:`Holding`, and the number of the
    member's last gift it has counted (:meth:`SlotLedger.give`)."""

    others: Holding = Holding()
    gifts: int = 0


@attrs.define
class _Member:
    seen: float
    report: Holding = Holding()
    offered: dict[SlotKey, int] = attrs.Factory(dict)
    """Slots given here and offered to this member, not yet answered for."""


class SlotLedger:
    """Every member's slots in use, waiting heads and offered slots."""

    def __init__(self, lease: float = LEASE) -> None:
        self._lease = lease
        self._members: dict[str, _Member] = {}

    @classmethod
    def of(
        cls, reports: Mapping[str, Holding], offered: Iterable[tuple[str, SlotKey]]
    ) -> SlotLedger:
        """A ledger holding these reports, and these slots offered to their members (as
        the shared store keeps them: :mod:`crossbar.sharing.store`)."""
        ledger = cls()
        for name, report in reports.items():
            ledger.report(name, report, 0.0)
        for name, key in offered:
            member = ledger._members.get(name)
            if member is not None:
                member.offered[key] = member.offered.get(key, 0) + 1
        return ledger

    def join(self, name: str, now: float) -> None:
        """Member ``name`` connects (again): it starts with nothing counted."""
        self._members[name] = _Member(now)

    def leave(self, name: str) -> bool:
        """Member ``name`` is gone: its slots and waiting heads with it. Whether it was known."""
        return self._members.pop(name, None) is not None

    def report(self, name: str, report: Holding, now: float) -> None:
        """Member ``name``'s report now, replacing its last."""
        member = self._members.get(name)
        if member is None:
            member = self._members[name] = _Member(now)
        member.seen = now
        member.report = Holding(
            {key: n for key, n in report.counts.items() if n > 0},
            dict(report.heads),
            {flow: n for flow, n in report.flows.items() if n > 0},
        )

    def seen(self, name: str, now: float) -> None:
        """Member ``name`` is alive (a heartbeat): its lease runs from ``now``."""
        member = self._members.get(name)
        if member is not None:
            member.seen = now

    def others(self, name: str) -> Holding:
        """What member ``name`` is shown: the slots every other member holds or is offered,
        the first head of each pool among the others (by :data:`Order`), and each flow's
        requests in flight in the others."""
        counts: dict[SlotKey, int] = {}
        heads: dict[Hashable, Head] = {}
        orders: dict[Hashable, Order] = {}
        flows: dict[str, int] = {}
        totals = self._running()
        for other, member in self._members.items():
            if other == name:
                continue
            for held in (member.report.counts, member.offered):
                for key, n in held.items():
                    counts[key] = counts.get(key, 0) + n
            for pool, head in member.report.heads.items():
                order = _order(head, totals)
                if pool not in orders or order < orders[pool]:
                    heads[pool], orders[pool] = head, order
            for flow, n in member.report.flows.items():
                flows[flow] = flows.get(flow, 0) + n
        return Holding(counts, heads, flows)

    def _running(self) -> dict[str, int]:
        """Each flow's requests in flight in every member."""
        totals: dict[str, int] = {}
        for member in self._members.values():
            for flow, n in member.report.flows.items():
                totals[flow] = totals.get(flow, 0) + n
        return totals

    def give(self, name: str, key: SlotKey) -> None:
        """Member ``name`` gives up one slot of ``key`` it reported, to be offered: its gift
        comes before the report that no longer counts the slot."""
        member = self._members.get(name)
        if member is not None and member.report.counts.get(key):
            counts = dict(member.report.counts)
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
            member.report = attrs.evolve(member.report, counts=counts)

    def offer(
        self, key: SlotKey, pools: Iterable[Hashable], skip: Iterable[str] = ()
    ) -> str | None:
        """The member to offer a freed slot of ``key`` to: the one whose head in ``pools`` is
        first (none in ``skip``, those that passed it on); the slot counts as its own until
        :meth:`answered`. ``None``: nobody waits for it."""
        best: tuple[Order, str] | None = None
        passed, totals = set(skip), self._running()
        for name, member in self._members.items():
            if name in passed:
                continue
            for pool in pools:
                head = member.report.heads.get(pool)
                if head is not None and (best is None or (_order(head, totals), name) < best):
                    best = (_order(head, totals), name)
        if best is None:
            return None
        offered = self._members[best[1]].offered
        offered[key] = offered.get(key, 0) + 1
        return best[1]

    def answered(self, name: str, key: SlotKey) -> None:
        """Member ``name`` answered an offer of ``key``: it counts the slot itself now (its
        report came first), or passed it on."""
        member = self._members.get(name)
        if member is None:
            return
        left = member.offered.get(key, 0) - 1
        if left > 0:
            member.offered[key] = left
        else:
            member.offered.pop(key, None)

    def expired(self, now: float) -> list[str]:
        """Members silent for a lease, dropped now with their counts."""
        gone = [n for n, m in self._members.items() if now - m.seen > self._lease]
        for name in gone:
            del self._members[name]
        return gone

    def members(self) -> list[str]:
        """The members known now, in the order they joined."""
        return list(self._members)

    def held(self, name: str) -> int:
        """Slots member ``name`` holds or is offered (0 when unknown)."""
        member = self._members.get(name)
        if member is None:
            return 0
        return sum(member.report.counts.values()) + sum(member.offered.values())


def _order(head: Head, running: Mapping[str, int]) -> Order:
    """``head`` as compared across workers: its flow's requests in flight in all of them."""
    band, in_flight, arrived, flow = head
    return band, max(in_flight, running.get(flow, 0)), arrived

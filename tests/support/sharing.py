"""A process's queue as the shared count's member reads it: its waiting heads, its flows in
flight, and slots offered to it (taken by a waiting request, or not)."""

from __future__ import annotations

from collections.abc import Hashable

from crossbar.queueing import Head, Traffic
from crossbar.sharing.ledger import SlotKey


class StubQueue:
    """The worker's fair queue, as far as the member reads it."""

    def __init__(self) -> None:
        self.waiting: dict[Hashable, Head] = {}
        self.flows: dict[str, int] = {}
        self.others: dict[str, int] = {}
        """Each flow's requests in flight in the other processes, as last told."""

    def heads(self) -> dict[Hashable, Head]:
        return dict(self.waiting)

    def running(self) -> dict[str, int]:
        return dict(self.flows)

    def flow(self, name: str) -> tuple[int, int]:
        return 0, self.flows.get(name, 0)

    def elsewhere(self, running: dict[str, int]) -> None:
        self.others = dict(running)


class StubWaits:
    """The worker's queue: its heads, and offered slots (taken by a waiting request, which
    then counts in the traffic)."""

    def __init__(self, traffic: Traffic, takes: bool) -> None:
        self.traffic, self.takes, self.queue = traffic, takes, StubQueue()
        self.offers: list[SlotKey] = []

    def offered(self, host: str, model: str | None) -> bool:
        self.offers.append((host, model))
        if self.takes:
            self.traffic.move(None, host, model)
        return self.takes

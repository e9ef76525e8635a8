"""Where requests wait in the fair queue (:mod:`crossbar.queueing.queue`): one request
waiting, a flow's line in a pool, a pool, and a route's waiting room.

A *room* holds every pool of one route (each model, each host a ``cache_affinity`` turn
waits for), so that the route's ``max_waiting`` is one count however many pools it has.
It keeps each flow's places in it, so that a full room can name the flow holding the most
and that flow's newest request. Lines are in arrival order and cleaned lazily: a request
that went stays in a line until the line is next looked at, or until the stale ones
outnumber the live ones. Values only, no I/O.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

import attrs

from crossbar.queueing.flows import Flow

T = TypeVar("T")

SLACK = 16
"""Stale entries a heap or line may hold beyond as many as its live ones."""


@attrs.define(eq=False)
class Waiting(Generic[T]):
    """One request waiting, as :meth:`FairQueue.push` gave it; read-only to callers."""

    item: T
    flow: Flow
    pool: Hashable
    arrived: float
    deadline: float | None
    seq: int = attrs.field(repr=False)
    live: bool = True
    """Still waiting: not yet popped, removed or expired."""
    room: str | None = None
    """The room it counts in (its route's name), if it was queued with a limit."""


@attrs.define(eq=False)
class Lane:
    """One flow's requests in one pool, in arrival order, and its entry in the pool's heap."""

    line: deque[Waiting[Any]] = attrs.Factory(deque)
    live: int = 0
    entry: Entry | None = None


Entry = tuple[int, int, float, int, int, Lane]
"""Band, in flight, ``v``, the lane's first request's number, a tie-break; the lane."""


Head = tuple[int, int, float, str]
"""A pool's first waiting request as every worker orders it: its band (lower first), its
flow's requests in flight (in this worker; across them all, once compared), when it came
(the clock's seconds), and its flow's name."""


def age(order: deque[Waiting[Any]], now: float) -> float:
    """Seconds the oldest live request of ``order`` (arrival order, one live at least)
    has waited; the gone ones before it are dropped."""
    while not order[0].live:
        order.popleft()
    return now - order[0].arrived


@attrs.define(eq=False)
class LanePool:
    """The requests a slot of one kind can serve: a heap of its flows' lanes."""

    heap: list[Entry] = attrs.Factory(list)
    lanes: dict[str, Lane] = attrs.Factory(dict)
    order: deque[Waiting[Any]] = attrs.Factory(deque)
    """Every request of the pool in arrival order: its first live one is the oldest."""
    live: int = 0

    def head(self) -> Head | None:
        """The first request here as every worker orders it (:mod:`crossbar.sharing`): its
        band, its flow's requests in flight here, when it came, and its flow; ``None`` when
        none may go (each flow with one waiting runs its ``max_in_flight``)."""
        heap = self.heap
        while heap and heap[0] is not heap[0][-1].entry:
            heapq.heappop(heap)
        if not heap:
            return None
        band, in_flight, *_, lane = heap[0]
        line = lane.line
        while not line[0].live:
            line.popleft()
        return band, in_flight, line[0].arrived, line[0].flow.name


@attrs.define(eq=False)
class RouteQueue:
    """Every request waiting in one route's pools, and each flow's places among them."""

    live: int = 0
    order: deque[Waiting[Any]] = attrs.Factory(deque)
    """Every request of the room in arrival order: its first live one is the oldest."""
    lines: dict[str, deque[Waiting[Any]]] = attrs.Factory(dict)
    """Each flow's requests in the room, in arrival order."""
    places: dict[str, int] = attrs.Factory(dict)
    """Each flow's requests waiting in the room (only flows with one at least)."""

    def add(self, waiting: Waiting[Any]) -> None:
        name = waiting.flow.name
        self.live += 1
        self.order.append(waiting)
        self.lines.setdefault(name, deque()).append(waiting)
        self.places[name] = self.places.get(name, 0) + 1

    def drop(self, waiting: Waiting[Any]) -> None:
        """``waiting`` (no longer live) went: popped, removed or expired."""
        name = waiting.flow.name
        self.live -= 1
        left = self.places[name] - 1
        if left:
            self.places[name] = left
            line = self.lines[name]
            if len(line) > 2 * left + SLACK:
                self.lines[name] = deque(w for w in line if w.live)
        else:
            del self.places[name], self.lines[name]
        if len(self.order) > 2 * self.live + SLACK:
            self.order = deque(w for w in self.order if w.live)

    def newest(self, name: str) -> Waiting[Any]:
        """Flow ``name``'s newest request waiting here (it has one at least)."""
        line = self.lines[name]
        while not line[-1].live:
            line.pop()
        return line[-1]

    def most(self, besides: int) -> str | None:
        """The flow holding the most places, if it holds two more than ``besides`` at
        least (else giving one of them up would only make another hold the most); ties go
        to the lower band (batch before normal), then to the newest request."""
        if not self.places:
            return None
        name = max(self.places, key=self._weight)
        return name if self.places[name] >= besides + 2 else None

    def _weight(self, name: str) -> tuple[int, int, int]:
        newest = self.newest(name)
        return self.places[name], newest.flow.band, newest.seq

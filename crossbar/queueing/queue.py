"""The fair queue: requests waiting in crossbar for a slot, and which one gets the next.

When all the slots a request could use are busy, it waits here in a *pool* the caller
names (any hashable), and a freed slot asks :meth:`FairQueue.pop` for the pools it can
serve. Next is the highest band with anyone waiting (strict), then the flow (a client)
with the least service lately, then the earliest arrival (FIFO per flow and pool).
Service lately is, first, the flow's requests in flight now (here and, with workers or
replicas, in the other processes), then its slot-seconds decayed with a half-life, a
flow becoming active starting at the queue's virtual time. The arithmetic, and why:
``docs/design/queue.md``. Pure: every call is given the time.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Mapping
from itertools import count
from typing import Generic, TypeVar

import attrs

from crossbar.queueing.flows import Flow, PoolLimit, Refused, gave_way, refusal
from crossbar.queueing.lanes import SLACK, Entry, Head, Lane, LanePool, RouteQueue, Waiting, age
from crossbar.queueing.slotuse import WINDOW_SECONDS, SlotTime, SlotUse

__all__ = ["FairQueue", "Flow", "PoolLimit", "Refused", "Waiting"]

T = TypeVar("T")

_RENORMALISE = 32.0
"""Half-lives after ``t0`` past which every ``v`` is rescaled (``2**32``: far from overflow)."""
_FORGET_BELOW = 1e-3
"""Decayed slot-seconds below which an idle flow is as good as new and is forgotten."""


@attrs.define(eq=False)
class _FlowState:
    flow: Flow
    active: float
    in_flight: int = 0
    waiting: int = 0
    v: float = 0.0
    lanes: dict[Hashable, Lane] = attrs.Factory(dict)


class FairQueue(Generic[T]):
    """Requests waiting for a slot, by pool; which goes next; each flow's service."""

    def __init__(self, half_life: float = 60.0, max_flows: int = 10_000) -> None:
        if not half_life > 0 or max_flows < 1:
            raise ValueError("half_life must be positive and max_flows at least 1")
        self._half_life = half_life
        self._max_flows = max_flows
        self._t0: float | None = None
        self._flows: dict[str, _FlowState] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # idle flows, least recent first
        self._pools: dict[Hashable, LanePool] = {}
        self._rooms: dict[str, RouteQueue] = {}
        self._deadlines: list[tuple[float, int, Waiting[T]]] = []
        self._waiting = 0
        self._vtime = 0.0
        """The virtual time, in ``v``'s units: where a flow that becomes active starts."""
        self._seq = count()
        self._used = SlotTime()
        self._elsewhere: Mapping[str, int] = {}
        """Each flow's requests in flight in the other workers or replicas (as last told)."""

    def push(
        self,
        pool: Hashable,
        flow: Flow,
        item: T,
        now: float,
        deadline: float | None = None,
        pool_limit: PoolLimit | None = None,
        arrived: float | None = None,
    ) -> Waiting[T] | Refused:
        """Queue ``item`` in ``pool``, or say in words why not (429): the flow or the
        pool already has as many waiting as it may. Never raises. ``arrived``: when it
        began waiting, when before ``now`` (moved from another pool). ``pool_limit``: the
        room it counts in (its route, all pools of it) and how many may wait there."""
        state, found, refused = self._state(flow, now), self._pools.get(pool), None
        room = self._rooms.get(pool_limit.name) if pool_limit is not None else None
        if flow.max_waiting is not None and state.waiting >= flow.max_waiting:
            oldest = min((lane.line[0].arrived for lane in state.lanes.values()), default=now)
            refused = refusal(flow.name, flow.max_waiting, now - oldest)
        elif pool_limit is not None and (room.live if room else 0) >= pool_limit.max_waiting:
            waited = age(room.order, now) if room is not None else 0.0
            refused = refusal(pool_limit.name, pool_limit.max_waiting, waited)
        if refused is not None:
            self._settle(state, now)
            return refused
        self._wake(state)
        box = found if found is not None else self._pools.setdefault(pool, LanePool())
        deadline = deadline if deadline is not None and math.isfinite(deadline) else None
        since = now if arrived is None else arrived
        waiting: Waiting[T] = Waiting(item, flow, pool, since, deadline, next(self._seq))
        if pool_limit is not None:
            waiting.room = pool_limit.name
            self._rooms.setdefault(pool_limit.name, RouteQueue()).add(waiting)
        lane = state.lanes.get(pool)
        if lane is None:
            lane = state.lanes[pool] = box.lanes[flow.name] = Lane()
        lane.line.append(waiting)
        box.order.append(waiting)
        lane.live += 1
        box.live += 1
        state.waiting += 1
        self._waiting += 1
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, waiting.seq, waiting))
        if lane.live == 1:
            self._enter(state, lane, box)
        self._settle(state, now)
        return waiting

    def pop(self, pools: Iterable[Hashable], now: float) -> Waiting[T] | None:
        """The next request for a slot that can serve ``pools``, taken out and counted as
        started for its flow (do not call :meth:`started` for it); ``None`` when none of
        those pools has a request of a flow below its ``max_in_flight``."""
        self._renormalise(now)
        best: Entry | None = None
        for pool in pools:
            box = self._pools.get(pool)
            if box is None:
                continue
            heap = box.heap
            while heap and heap[0] is not heap[0][-1].entry:
                heapq.heappop(heap)
            if heap and (best is None or heap[0][:4] < best[:4]):
                best = heap[0]
        if best is None:
            return None
        lane = best[-1]
        waiting: Waiting[T] = lane.line[0]
        state = self._flows[waiting.flow.name]
        self._take(waiting, state, enter=False)
        state.in_flight += 1
        self._refresh(state)
        self._settle(state, now)
        return waiting

    def may_start(self, flow: Flow) -> bool:
        """Whether a request of ``flow`` may go to a slot now, free slots or not: fewer
        than its ``max_in_flight`` of its requests are running (sent after waiting here
        or not). Else it is to wait (:meth:`push`) for one of them to end."""
        state = self._flows.get(flow.name)
        return flow.may_start(state.in_flight if state is not None else 0)

    def make_room(
        self, flow: Flow, limit: PoolLimit, now: float
    ) -> tuple[Waiting[T], Refused] | None:
        """When ``limit``'s room (its route, every pool of it) is full, the newest request
        of the flow holding the most places there (two more than ``flow`` at least),
        taken out, with the 429 in words to answer it with; ``None`` when there is room,
        when no flow holds more than its share, or when ``flow`` may not wait anyway
        (past its own ``max_waiting``): then :meth:`push` refuses ``flow``'s request."""
        room = self._rooms.get(limit.name)
        if room is None or room.live < limit.max_waiting:
            return None
        waiting, _ = self.flow(flow.name)
        if flow.max_waiting is not None and waiting >= flow.max_waiting:
            return None
        name = room.most(room.places.get(flow.name, 0))
        if name is None:
            return None
        newest: Waiting[T] = room.newest(name)
        refused = gave_way(limit.name, limit.max_waiting, room.places[name], age(room.order, now))
        self.remove(newest)
        return newest, refused

    def remove(self, waiting: Waiting[T]) -> None:
        """The client left while waiting: never pop it. Nothing if it already went."""
        if waiting.live:
            state = self._flows[waiting.flow.name]
            self._take(waiting, state)
            self._settle(state, state.active)

    def expired(self, now: float) -> list[Waiting[T]]:
        """The requests whose deadline is ``now`` or past, taken out, for the caller to answer."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now:
            waiting = heapq.heappop(self._deadlines)[2]
            if waiting.live:
                self.remove(waiting)
                out.append(waiting)
        return out

    def started(self, flow: Flow, now: float) -> None:
        """A request of ``flow`` went to a host without waiting here."""
        state = self._state(flow, now)
        self._wake(state)
        state.in_flight += 1
        if state.lanes:
            self._refresh(state)
        self._settle(state, now)

    def finished(self, flow: Flow, seconds: float, now: float) -> None:
        """A request of ``flow`` ended after holding a slot ``seconds``: its service grows
        by them and it has one fewer in flight."""
        state = self._state(flow, now)  # renormalised first
        state.in_flight = max(0, state.in_flight - 1)
        seconds = seconds if math.isfinite(seconds) and seconds > 0 else 0.0
        if seconds:
            t0 = self._t0 if self._t0 is not None else now
            scaled = seconds * math.exp2((now - t0) / self._half_life)
            state.v += scaled
            self._vtime += scaled / max(1, len(self._flows) - len(self._idle))
        self._used.add(flow.name, seconds, now)
        if state.lanes:
            self._refresh(state)
        self._settle(state, now)

    def first(self, name: str, pools: Iterable[Hashable]) -> bool:
        """Whether flow ``name``, were it to ask now, would go before every request
        waiting in ``pools`` (and is below its ``max_in_flight``)."""
        state = self._flows.get(name)
        if state is None or not state.flow.may_start(state.in_flight):
            return False
        v = state.v if state.in_flight or state.waiting else max(state.v, self._vtime)
        key = (state.flow.band, state.in_flight + self._elsewhere.get(name, 0), v)
        for pool in pools:
            heap = self._pools[pool].heap if pool in self._pools else []
            while heap and heap[0] is not heap[0][-1].entry:
                heapq.heappop(heap)
            if heap and heap[0][:3] <= key:
                return False
        return True

    def elsewhere(self, running: Mapping[str, int]) -> None:
        """Each flow's requests in flight in the other processes now: they count in its
        order here as its own do (a flow busy elsewhere waits behind one idle everywhere)."""
        before, self._elsewhere = self._elsewhere, running
        for name in before.keys() | running.keys():
            state = self._flows.get(name)
            if state is not None and state.lanes and before.get(name) != running.get(name):
                self._refresh(state)

    def waiting(self, pool: Hashable | None = None) -> int:
        """Requests waiting in ``pool``, or in all pools."""
        box = self._pools.get(pool) if pool is not None else None
        return self._waiting if pool is None else (box.live if box is not None else 0)

    def heads(self, pools: Iterable[Hashable] | None = None) -> dict[Hashable, Head]:
        """The first request of each pool (or of ``pools``) as every worker orders it."""
        boxes = self._pools if pools is None else {p: self._pools.get(p) for p in pools}
        return {p: h for p, box in boxes.items() if box and (h := box.head()) is not None}

    def running(self) -> dict[str, int]:
        """Each flow's requests in flight here (flows with one at least)."""
        return {name: s.in_flight for name, s in self._flows.items() if s.in_flight}

    def pools(self) -> dict[Hashable, int]:
        """Every pool that has requests waiting, with how many."""
        return {pool: box.live for pool, box in self._pools.items() if box.live}

    def flow(self, name: str) -> tuple[int, int]:
        """Flow ``name``'s requests waiting (in all pools) and in flight."""
        state = self._flows.get(name)
        return (state.waiting, state.in_flight) if state is not None else (0, 0)

    def oldest(self, pool: Hashable, now: float) -> float | None:
        """Seconds the oldest request waiting in ``pool`` has waited; ``None`` if none."""
        box = self._pools.get(pool)
        return age(box.order, now) if box is not None else None

    def service(self, name: str, now: float) -> float:
        """Flow ``name``'s service decayed to ``now`` (or to ``t0`` if that is later): its
        slot-seconds since it last became active, on top of the virtual time then."""
        state = self._flows.get(name)
        if state is None or self._t0 is None:
            return 0.0
        return state.v * math.exp2(-max(0.0, now - self._t0) / self._half_life)

    def shares(self, now: float) -> dict[str, float]:
        """Each flow's share of the last five minutes' slot-seconds (:mod:`.slotuse`)."""
        return self._used.shares(now)

    def usage(self, now: float) -> dict[str, SlotUse]:
        """As :meth:`shares`, with each flow's slot-seconds and requests."""
        return self._used.usage(now)

    @property
    def remembered(self) -> int:
        """Flows kept: busy ones, and idle ones not yet forgotten (past ``max_flows``, none)."""
        return len(self._flows)

    @property
    def entries(self) -> int:
        """Entries held in the heaps and lines, live or stale: what memory grows with."""
        return len(self._deadlines) + sum(
            len(box.heap) + len(box.order) + sum(len(lane.line) for lane in box.lanes.values())
            for box in self._pools.values()
        )

    def _state(self, flow: Flow, now: float) -> _FlowState:
        self._renormalise(now)
        state = self._flows.get(flow.name)
        if state is None:
            state = self._flows[flow.name] = _FlowState(flow, now)
        elif state.flow is not flow and state.flow != flow:  # a reload changed its band or limits
            state.flow = flow
            self._refresh(state)
        state.active = now
        return state

    def _wake(self, state: _FlowState) -> None:
        """A flow with nothing running or waiting becomes active: it starts no lower
        than the virtual time (its own past, when more, is kept)."""
        if not state.in_flight and not state.waiting and state.v < self._vtime:
            state.v = self._vtime

    def _settle(self, state: _FlowState, now: float) -> None:
        """Note whether ``state`` is idle, and forget idle flows that are due."""
        name = state.flow.name
        if state.waiting or state.in_flight:
            self._idle.pop(name, None)
        else:
            self._idle[name] = None
            self._idle.move_to_end(name)
        while self._idle:
            oldest = self._flows[next(iter(self._idle))]
            if len(self._flows) <= self._max_flows and (
                now - oldest.active < WINDOW_SECONDS
                or self.service(oldest.flow.name, now) >= _FORGET_BELOW
            ):
                break
            del self._flows[oldest.flow.name]
            self._used.forget(oldest.flow.name)
            self._idle.popitem(last=False)

    def _take(self, waiting: Waiting[T], state: _FlowState, enter: bool = True) -> None:
        """Take ``waiting`` out of its lane and pool (it goes, or it left); ``enter``:
        give its lane a new entry if it was first (else the caller refreshes them all)."""
        waiting.live = False
        if waiting.room is not None:
            room = self._rooms[waiting.room]
            room.drop(waiting)
            if not room.live:
                del self._rooms[waiting.room]
        box = self._pools[waiting.pool]
        lane = state.lanes[waiting.pool]
        lane.live -= 1
        box.live -= 1
        state.waiting -= 1
        self._waiting -= 1
        if not lane.live:
            lane.entry = None
            del state.lanes[waiting.pool], box.lanes[waiting.flow.name]
        elif enter and lane.line[0] is waiting:
            self._enter(state, lane, box)  # a new first one: a new entry
        elif len(lane.line) > 2 * lane.live + SLACK:
            lane.line = deque(w for w in lane.line if w.live)
        if not box.live:
            del self._pools[waiting.pool]
        elif len(box.order) > 2 * box.live + SLACK:
            box.order = deque(w for w in box.order if w.live)
        if len(self._deadlines) > 2 * self._waiting + SLACK:
            self._deadlines = [d for d in self._deadlines if d[2].live]
            heapq.heapify(self._deadlines)

    def _enter(self, state: _FlowState, lane: Lane, box: LanePool) -> None:
        """Give ``lane`` a fresh entry in its pool's heap for its flow's key now (none if
        the flow is at its ``max_in_flight``), the old one left to be skipped."""
        while not lane.line[0].live:
            lane.line.popleft()
        if not state.flow.may_start(state.in_flight):
            lane.entry = None
            return
        running = state.in_flight + self._elsewhere.get(state.flow.name, 0)
        key = (state.flow.band, running, state.v, lane.line[0].seq, next(self._seq))
        lane.entry = (*key, lane)
        heapq.heappush(box.heap, lane.entry)
        if len(box.heap) > 2 * len(box.lanes) + SLACK:
            box.heap = [ln.entry for ln in box.lanes.values() if ln.entry is not None]
            heapq.heapify(box.heap)

    def _refresh(self, state: _FlowState) -> None:
        """The flow's key changed: new entries in every pool it waits in."""
        for pool, lane in state.lanes.items():
            self._enter(state, lane, self._pools[pool])

    def _renormalise(self, now: float) -> None:
        """Move ``t0`` to ``now`` once the exponent grows large: every ``v`` shrinks by
        the same factor (order kept) and every heap is rebuilt with the new values."""
        if self._t0 is None:
            self._t0 = now
        if (now - self._t0) / self._half_life < _RENORMALISE:
            return
        factor = math.exp2(-(now - self._t0) / self._half_life)
        self._t0 = now
        self._vtime *= factor
        for box in self._pools.values():
            box.heap = []
        for state in self._flows.values():
            state.v *= factor
            self._refresh(state)

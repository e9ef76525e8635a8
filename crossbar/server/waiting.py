"""Requests that wait in crossbar for a slot, and which one is sent when a slot frees.

A host's slots are known from the config (``slots:``) or from the host itself (each
loaded model's ``total_slots``). When every host of a request's best group has all its
slots for the request's model busy, the request waits here rather than in one host's own
queue, where it would wait for that host even if another freed a slot first, behind
whoever came first, unseen. The moment a request leaves a host, the next waiting request
that host can serve is sent to it: the highest priority band first, then the flow (a key's
holder, or a client's address) that has had the least service lately
(:mod:`crossbar.fleet.queue`). A route with ``queue: off``, or whose slots are not known,
sends every request on at once, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable
from hashlib import blake2b
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.config import Config, RouteConfig, Secret
from crossbar.fleet import HealthTable, Traffic, best_group
from crossbar.fleet.queue import Flow, PoolLimit, Refused, Waiting
from crossbar.server.keys import key_held

TICK = 1.0
"""Seconds between two looks at what waits (time-outs, hosts come back) while any does."""
BANDS = {"interactive": 0, "normal": 1, "batch": 2}


class Waiter(Protocol):
    """What a waiting request is to the queue (an :class:`~crossbar.server.exchange.Exchange`)."""

    def dispatched(self, waited: float) -> None: ...
    def shed(self, refused: Refused) -> None: ...


class Waits:
    """The queue of one crossbar (per worker), over the traffic's slots."""

    def __init__(self, traffic: Traffic, table: HealthTable, clock: IReactorTime) -> None:
        self.traffic = traffic
        self.table = table
        self.clock = clock
        self.queue = traffic.queue
        self._routes: dict[str, RouteConfig] = {}
        self._serving: dict[str, list[str]] = {}
        """Each host's routes: the pools a slot of it can serve."""
        self._timer: IDelayedCall | None = None
        self._held: dict[int, Waiting[Waiter]] = {}
        """Every request waiting now, by its number (a stop answers them all)."""
        traffic.freed = self.freed

    def configure(self, config: Config) -> None:
        """The routes of a config (and again after a reload): waiting requests stay."""
        self._routes = dict(config.routes)
        serving: dict[str, list[str]] = {}
        for route in config.routes.values():
            for host in route.hosts:
                serving.setdefault(host, []).append(route.name)
        self._serving = serving

    # -- admission --------------------------------------------------------------------------

    def active(self) -> bool:
        """Whether any host's slots are known (the config's, or a host's own word): if
        none are, nothing can be full and nothing ever waits."""
        return bool(self.traffic.slots) or any(s.slots for s in self.table.view.values())

    def full_hosts(
        self, route: RouteConfig, model: str | None, exclude: Iterable[str]
    ) -> list[str]:
        """The hosts of the request's best group with every slot for ``model`` taken."""
        if not route.queue:
            return []
        states, full = self.table.view, self.traffic.full
        group = best_group(route.hosts, model, states, frozenset(exclude))
        return [s.name for s in group if full(s.name, model, s.slots)]

    def must_wait(self, route: RouteConfig, model: str | None, exclude: Iterable[str]) -> bool:
        """Whether every host of the best group is known to be full (none: no waiting)."""
        if not route.queue:
            return False
        states, full = self.table.view, self.traffic.full
        group = best_group(route.hosts, model, states, frozenset(exclude))
        return bool(group) and all(full(s.name, model, s.slots) for s in group)

    def wait(
        self, waiter: Waiter, route: RouteConfig, model: str | None, flow: Flow
    ) -> Waiting[Waiter] | Refused:
        """Queue ``waiter`` (or say why not: a limit, answered 429)."""
        now = self.clock.seconds()
        limit = PoolLimit(route.name, route.max_waiting)
        placed = self.queue.push(
            (route.name, model), flow, waiter, now, now + route.wait_timeout, limit
        )
        if isinstance(placed, Waiting):
            self._held[placed.seq] = placed
            if self._timer is None:
                self._timer = self.clock.callLater(TICK, self._tick)
        return placed

    def leave(self, waiting: Waiting[Waiter]) -> None:
        """A waiting client left: it is dropped at once, and no host ever sees it."""
        self.queue.remove(waiting)
        self._held.pop(waiting.seq, None)

    def started(self, flow: Flow) -> None:
        """A request of ``flow`` went to a host without waiting: it counts in its share."""
        self.queue.started(flow, self.clock.seconds())

    def finished(self, flow: Flow, seconds: float) -> None:
        """A request of ``flow`` that held a slot ``seconds`` ended."""
        self.queue.finished(flow, seconds, self.clock.seconds())

    # -- dispatch ---------------------------------------------------------------------------

    def freed(self, host: str, model: str | None) -> None:
        """A request left ``host``: one of its slots for ``model`` is free."""
        if not self.queue.waiting():
            return  # nothing waits: costs nothing
        pools: list[Hashable] = [(route, model) for route in self._serving.get(host, ())]
        self._send(pools)

    def _send(self, pools: list[Hashable]) -> None:
        """The next request a freed slot of ``pools`` can serve goes to it."""
        now = self.clock.seconds()
        waiting = self.queue.pop(pools, now)
        if waiting is not None:
            self._held.pop(waiting.seq, None)
            waiting.item.dispatched(now - waiting.arrived)

    def _tick(self) -> None:
        """Time-outs, and pools whose hosts have room again (a host back up, a reload)."""
        self._timer = None
        now = self.clock.seconds()
        for waiting in self.queue.expired(now):
            self._held.pop(waiting.seq, None)
            route, waited = waiting.pool[0], now - waiting.arrived  # type: ignore[index]
            words = f"{route}: waited {waited:.0f}s for a free slot (its wait_timeout)"
            waiting.item.shed(Refused(429, words, 1, "timeout"))
        pools = {w.pool for w in self._held.values()}
        for pool in pools:
            route = self._routes.get(pool[0])  # type: ignore[index]
            while self.queue.waiting(pool) and (
                route is None or not self.must_wait(route, pool[1], ())  # type: ignore[index]
            ):
                before = self.queue.waiting(pool)
                self._send([pool])
                if self.queue.waiting(pool) == before:  # every flow at its max_in_flight
                    break
        if self.queue.waiting():
            self._timer = self.clock.callLater(TICK, self._tick)

    def drain(self) -> None:
        """crossbar is stopping: whoever waits is answered 503 now."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        held, self._held = self._held, {}
        for waiting in held.values():
            self.queue.remove(waiting)
            waiting.item.shed(Refused(503, "crossbar is stopping", 5, "stopping"))


def flow_of(
    route: RouteConfig, headers: Iterable[tuple[bytes, Any]], client: str, key: Secret | None = None
) -> Flow:
    """Who a request is, for fairness: its key's holder (by name), an unnamed key (by a
    short fingerprint that cannot be turned back into it), else the client's address.
    ``key``: the one the door let it in with, if it is one of the route's (else the
    head is read again)."""
    if route.api_keys:
        if key is None or not any(mine is key for mine in route.api_keys):
            key = key_held(list(headers), route.api_keys)
        if key is not None:
            return _key_flow(key)
    return Flow(client, BANDS["normal"])


_FLOWS: dict[int, tuple[Secret, Flow]] = {}
"""Each configured key's flow, made once (a frozen value, checked as it is built)."""


def _key_flow(key: Secret) -> Flow:
    known = _FLOWS.get(id(key))
    if known is not None and known[0] is key:
        return known[1]
    holder = key.holder
    if holder is None:
        flow = Flow(f"key-{_fingerprint(key.value)}")
    else:
        flow = Flow(
            holder.name, BANDS.get(holder.priority, 1), holder.max_in_flight, holder.max_waiting
        )
    if len(_FLOWS) >= 1024:  # reloads made new keys: the old ones go
        _FLOWS.clear()
    _FLOWS[id(key)] = (key, flow)
    return flow


@functools.lru_cache(maxsize=256)
def _fingerprint(value: bytes) -> str:
    """Remembered: called with configured keys' values only, a few, on every request."""
    return blake2b(value, digest_size=4, person=b"crossbar-flow").hexdigest()

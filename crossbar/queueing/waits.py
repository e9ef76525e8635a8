"""Requests that wait in crossbar for a slot, and which one is sent when a slot frees.

When every host of a request's best group has all its slots for the request's model busy
(``slots:``, or each loaded model's ``total_slots``), the request waits here rather than in
one host's own queue. The moment a request leaves a host, the next waiting request that
host can serve is sent to it: the highest band first, then the flow (a key's holder, or a
client's address) with the least service lately (:mod:`crossbar.queueing.queue`). A route
with ``queue: off``, or whose slots are not known, sends every request on at once.

A ``cache_affinity`` turn whose own host (where its conversation's prompt is cached) has
every slot busy waits for a slot of that host alone, in a pool of its own, for at most the
route's ``home_wait``; then it waits for any host of its group (or goes at once to one with
room), and the move prefills the conversation again there.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.config import Config, RouteConfig
from crossbar.polling import HealthTable
from crossbar.queueing.answers import STOPPING, Go, Queued, SlotShare, Waiter
from crossbar.queueing.queue import Flow, PoolLimit, Refused, Waiting
from crossbar.queueing.traffic import Traffic
from crossbar.routing import Conversation, best_group, rendezvous, spill_places

TICK = 1.0
"""Seconds between two looks at what waits (time-outs, hosts come back) while any does."""
KEEP = 0.025
"""Seconds a slot stays kept for its flow's next request, when that flow has nothing else
running or waiting and would be served first (why: ``docs/design/queue.md``)."""


class Waits:
    """The queue of one crossbar (per worker), over the traffic's slots."""

    def __init__(
        self,
        traffic: Traffic,
        table: HealthTable,
        clock: IReactorTime,
        share: SlotShare | None = None,
    ) -> None:
        self.traffic, self.table, self.clock, self.queue = traffic, table, clock, traffic.queue
        self.share = share  # the other workers' (or replicas') waiting requests
        self._routes: dict[str, RouteConfig] = {}
        self._serving: dict[str, list[str]] = {}
        """Each host's routes: the pools a slot of it can serve."""
        self._timer: IDelayedCall | None = None
        self._stopping = False
        """crossbar stops (:meth:`drain`): a request that would wait is answered 503."""
        self._held: dict[int, Waiting[Waiter]] = {}
        """Every request waiting now, by its number (a stop answers them all)."""
        self._homing: dict[int, IDelayedCall] = {}  # each turn's end of waiting for home
        self._freeing: str | None = None  # the host whose slot a dispatch now is for
        self._kept: dict[str, tuple[str, str | None, IDelayedCall]] = {}
        """Each flow's slot kept for it (:data:`KEEP`): the host, the model, the release."""

    def configure(self, config: Config) -> None:
        """The routes of a config (and again after a reload): waiting requests stay."""
        self._routes = dict(config.routes)
        serving: dict[str, list[str]] = {}
        for route in config.routes.values():
            for host in route.hosts:
                serving.setdefault(host, []).append(route.name)
        self._serving = serving

    def route(self, name: str) -> RouteConfig | None:
        """Route ``name`` as the config now in force has it (``None``: gone)."""
        return self._routes.get(name)

    # -- admission --------------------------------------------------------------------------

    def admit(
        self,
        waiter: Waiter,
        route: RouteConfig,
        model: str | None,
        flow: Flow,
        conversation: Conversation | None = None,
        *,
        tried: Sequence[str] = (),
        small: Sequence[str] = (),
        waited: bool = False,
        counted: bool = False,
        holding: str | None = None,
    ) -> Go | Queued | Refused:
        """Go now (:class:`Go`), wait (:class:`Queued`: ``waiter`` told later) or an answer
        now (:class:`Refused`). A first try waits when every slot it could use is busy, or
        its flow runs its ``max_in_flight``; a retry (``tried``), or one sent from the queue
        (``waited``: to the host whose slot freed for it), waits again only when every host
        it may use is full. ``counted``: its flow's share counts it already; ``holding``:
        its slot's host, given back if it waits; ``small``: hosts too small for its prompt."""
        first = not tried and not waited
        if first and (
            not self.queue.may_start(flow) or self._must_wait(route, model, small, conversation)
        ):  # past its max_in_flight it waits, free slots or not
            placed = self._wait(waiter, route, model, flow, conversation, small)
            return placed if isinstance(placed, Refused) else Queued(placed)
        if not first and self._must_wait(route, model, [*tried, *small]):
            if counted:
                self.queue.finished(flow, 0.0, self.clock.seconds())  # counted again when sent
            if holding is not None:  # first: its slot there frees to whoever waits next
                self.release(None, holding, model)
            placed = self._wait(waiter, route, model, flow)
            return placed if isinstance(placed, Refused) else Queued(placed)
        look = waited or not self.traffic.policies.of(route).reads_conversations
        full = tuple(self._full_hosts(route, model, [*tried, *small])) if look else ()
        freed = self._freeing  # a shared count may not yet show another host's newest
        if waited and freed in route.hosts and freed not in (*tried, *small, *full):
            full = tuple(h for h in route.hosts if h != freed)
        if not counted:
            self.queue.started(flow, self.clock.seconds())
            self._release(flow.name)
        return Go(full)

    def active(self) -> bool:
        """Whether any host's slots are known (the config's, or a host's own word): if
        none are, nothing can be full and nothing ever waits."""
        return bool(self.traffic.slots) or any(s.slots for s in self.table.view.values())

    def _full_hosts(self, route: RouteConfig, model: str | None, skip: Iterable[str]) -> list[str]:
        """The hosts of the request's best group with every slot for ``model`` taken."""
        if not route.queue:
            return []
        states, full = self.table.view, self.traffic.usage.full
        group = best_group(route.hosts, model, states, frozenset(skip))
        return [s.name for s in group if full(s, model)]

    def _must_wait(
        self,
        route: RouteConfig,
        model: str | None,
        exclude: Iterable[str],
        conversation: Conversation | None = None,
    ) -> bool:
        """Whether every host of the best group is known to be full (none: no waiting) and
        (``spillover: true``) no other host can start one more copy of the model, or the
        turn of ``conversation`` is to wait for its own host (:meth:`_home`)."""
        if not route.queue:
            return False
        states, full, skip = self.table.view, self.traffic.usage.full, frozenset(exclude)
        group = best_group(route.hosts, model, states, skip)
        busy = [s for s in group if full(s, model)]
        if not busy and not skip:  # most requests: then no host, its home neither, is full
            return False
        if self._home(route, model, conversation, skip) is not None:
            return True
        if not group or len(busy) < len(group):
            return False
        if route.spillover:
            hosts = [states[h] for h in route.hosts if h not in skip and h in states]
            healthy = [s for s in hosts if s.healthy]
            usage, now, idle = self.traffic.usage, self.clock.seconds(), route.min_idle_before_evict
            return not spill_places(healthy, model, usage, now, idle)
        return True

    def _home(
        self,
        route: RouteConfig,
        model: str | None,
        conversation: Conversation | None,
        skip: Iterable[str] = (),
    ) -> str | None:
        """The host a ``cache_affinity`` turn is to wait for (its last turn's, or its hash's
        home), in the best group, every slot busy, not in ``skip``; ``None``: none."""
        if conversation is None or not route.home_wait or not route.queue:
            return None
        policy = self.traffic.policies.of(route)
        if not policy.reads_conversations:
            return None
        group = {s.name: s for s in best_group(route.hosts, model, self.table.view)}
        host = policy.last_host(conversation.key)
        if host is None and conversation.turn:  # answered before, elsewhere
            host = rendezvous(conversation.key, list(group))[0] if group else None
        state = group.get(host) if host is not None else None
        if state is None or len(group) < 2 or state.name in skip:
            return None
        if not self.traffic.usage.full(state, model):
            return None
        return state.name

    def _wait(
        self,
        waiter: Waiter,
        route: RouteConfig,
        model: str | None,
        flow: Flow,
        conversation: Conversation | None = None,
        small: Sequence[str] = (),
    ) -> Waiting[Waiter] | Refused:
        """Queue ``waiter`` (for its own host first, a ``cache_affinity`` turn whose host is
        full), or say why not: a limit, answered 429; crossbar stopping, 503."""
        if self._stopping:
            return STOPPING
        now = self.clock.seconds()
        limit = PoolLimit(route.name, route.max_waiting)
        home = self._home(route, model, conversation, small)
        pool = (route.name, model) if home is None else (route.name, model, home)
        made = self.queue.make_room(flow, limit, now)  # the biggest holder's newest gives way
        if made is not None:
            self._held.pop(made[0].seq, None)
            self._unhome(made[0].seq)
            made[0].item.shed(made[1])
        placed = self.queue.push(pool, flow, waiter, now, now + route.wait_timeout, limit)
        if flow.name in self._kept:  # its kept slot goes to the queue (to this one, as a
            self.clock.callLater(0, self._release, flow.name, True)  # rule) once queued
        if isinstance(placed, Waiting):
            self._held[placed.seq] = placed
            if self.share is not None:
                self.share.changed()
            if home is not None:
                later = self.clock.callLater(route.home_wait, self._leave_home, placed)
                self._homing[placed.seq] = later
            if self._timer is None:
                self._timer = self.clock.callLater(TICK, self._tick)
        return placed

    def leave(self, waiting: Waiting[Waiter]) -> None:
        """A waiting client left: it is dropped at once, and no host ever sees it."""
        self.queue.remove(waiting)
        self._held.pop(waiting.seq, None)
        self._unhome(waiting.seq)

    def _unhome(self, seq: int) -> None:
        later = self._homing.pop(seq, None)
        if later is not None and later.active():
            later.cancel()

    def _leave_home(self, waiting: Waiting[Waiter]) -> None:
        """A turn's ``home_wait`` is over: it goes at once to a host of its group with a
        free slot, or waits for the first of them to free one (its wait goes on counting)."""
        self._homing.pop(waiting.seq, None)
        if not waiting.live:
            return
        self.queue.remove(waiting)
        self._held.pop(waiting.seq, None)
        pool, route = waiting.pool[:2], self._routes.get(waiting.pool[0])  # type: ignore[index]
        now = self.clock.seconds()
        if route is None or not self._must_wait(route, pool[1], ()):
            waiting.item.dispatched(now - waiting.arrived)
            return
        limit = PoolLimit(route.name, route.max_waiting)  # still counted in its route's room
        placed = self.queue.push(
            pool, waiting.flow, waiting.item, now, waiting.deadline, limit, waiting.arrived
        )
        if isinstance(placed, Refused):  # a reload lowered its key's max_waiting meanwhile
            waiting.item.shed(placed)
            return
        self._held[placed.seq] = placed

    def release(
        self, flow: Flow | None, host: str | None, model: str | None, seconds: float = 0.0
    ) -> None:
        """A request for ``model`` leaves ``host`` (if it held a slot there): at its end,
        ``flow`` (if counted) is credited with ``seconds`` of service; the slot then goes
        to the next waiting request, or is kept a moment for ``flow``'s next (:data:`KEEP`).
        ``flow`` ``None``: it moves on to another host (a failover), or was never counted."""
        now = self.clock.seconds()
        if flow is not None:
            self.queue.finished(flow, seconds, now)
        if host is not None:
            self.traffic.move(host, None, model, now)
            self._freed(host, model, flow)

    # -- dispatch ---------------------------------------------------------------------------

    def _freed(
        self, host: str, model: str | None, ending: Flow | None, released: bool = False
    ) -> None:
        """A slot of ``host`` for ``model`` is free (``ending``: the flow whose request just
        ended in it): kept for it, owed to a request waiting in another worker, or taken here.
        ``released``: kept and not taken: the shared count's fresher order decides."""
        share = self.share
        if not self.queue.waiting() and (share is None or not (released or share.waiting())):
            return  # nothing waits: costs nothing
        state = self.table.view.get(host)
        if state is not None and not state.healthy:
            return  # a host that is down takes nothing from the queue
        pools = self._pools_of(host, model)
        if ending is not None and self._keep(ending, host, model, pools):
            return
        if share is None or not (
            (released and share.hand_over(host, model, pools))
            or share.owed(host, model, pools, [*self.queue.heads(pools).values()])
        ):
            self._send(pools, host)

    def _pools_of(self, host: str, model: str | None) -> list[Hashable]:
        """The pools a slot of ``host`` for ``model`` serves (its own, for turns waiting for it)."""
        routes = self._serving.get(host, ())
        return [*((route, model) for route in routes), *((route, model, host) for route in routes)]

    def offered(self, host: str, model: str | None) -> bool:
        """A slot freed in another worker is offered: whether a request waiting here took it
        (none does when one waiting elsewhere comes first, as last told: it is passed on)."""
        pools, before = self._pools_of(host, model), self.queue.waiting()
        if before and not self._stopping and not self._behind(pools):
            self._send(pools, host)
        return self.queue.waiting() < before

    def _keep(self, flow: Flow, host: str, model: str | None, pools: list[Hashable]) -> bool:
        """Keep the slot ``flow``'s request just freed for its next one (:data:`KEEP`), if
        nothing else of it runs or waits and it would be served first (in every worker)."""
        name = flow.name
        if name in self._kept or self.queue.flow(name) != (0, 0):
            return False
        if self.share is not None and self.share.ahead(
            pools, (flow.band, 0, self.clock.seconds(), name)
        ):
            return False
        if host not in self.traffic.in_flight or host in self.traffic.leaving:
            return False  # reloaded away: not to be given anything more
        if not self.queue.first(name, pools):
            return False
        self.traffic.move(None, host, model)  # taken, for now
        later = self.clock.callLater(KEEP, self._release, name)
        self._kept[name] = (host, model, later)
        return True

    def _release(self, name: str, came: bool = False) -> None:
        """Flow ``name``'s kept slot (if any) frees: the next waiting request takes it (if
        ``came``, its flow's next request waits here: this worker's order decides first)."""
        kept = self._kept.pop(name, None)
        if kept is not None:
            host, model, later = kept
            if later.active():
                later.cancel()
            self.traffic.move(host, None, model)
            self._freed(host, model, None, released=not came)

    def _send(self, pools: list[Hashable], host: str | None = None) -> None:
        """The next request a freed slot of ``pools`` (on ``host``) can serve goes to it."""
        now = self.clock.seconds()
        waiting = self.queue.pop(pools, now)
        if waiting is not None:
            self._held.pop(waiting.seq, None)
            self._unhome(waiting.seq)
            self._freeing = host
            try:
                waiting.item.dispatched(now - waiting.arrived)
            finally:
                self._freeing = None

    def _tick(self) -> None:
        """Time-outs, and pools whose hosts have room again (a host back up, a reload)."""
        self._timer = None
        now = self.clock.seconds()
        for waiting in self.queue.expired(now):
            self._held.pop(waiting.seq, None)
            self._unhome(waiting.seq)
            route, waited = waiting.pool[0], now - waiting.arrived  # type: ignore[index]
            words = f"{route}: waited {waited:.0f}s for a free slot (its wait_timeout)"
            waiting.item.shed(Refused(429, words, 1, "timeout"))
        pools = {w.pool for w in self._held.values()}
        for pool in pools:
            while self.queue.waiting(pool) and self._has_room(pool) and not self._behind([pool]):
                before = self.queue.waiting(pool)
                self._send([pool])
                if self.queue.waiting(pool) == before:  # every flow at its max_in_flight
                    break
        if self.queue.waiting():
            self._timer = self.clock.callLater(TICK, self._tick)

    def _behind(self, pools: list[Hashable]) -> bool:
        """Whether a request waiting in another worker comes before each pool's first here."""
        heads, share = self.queue.heads(pools).items(), self.share
        return bool(heads) and share is not None and all(share.ahead([p], h) for p, h in heads)

    def _has_room(self, pool: Any) -> bool:
        """Whether a request of ``pool`` can go now: a host of its group (of the host it
        waits for, in a turn's own pool) has a free slot, or its route is gone."""
        route = self._routes.get(pool[0])
        if route is None:
            return True
        if len(pool) == 3:
            state = self.table.view.get(pool[2])
            return state is None or not self.traffic.usage.full(state, pool[1])
        return not self._must_wait(route, pool[1], ())

    def drain(self) -> None:
        """crossbar is stopping: whoever waits is answered 503 now, as is, from now on, a
        request that would wait (else it would wait for the answers in flight until cut)."""
        self._stopping = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        held, self._held = self._held, {}
        for seq in list(self._homing):
            self._unhome(seq)
        for waiting in held.values():
            self.queue.remove(waiting)
            waiting.item.shed(STOPPING)
        for name in list(self._kept):
            self._release(name)

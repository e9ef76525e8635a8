"""What the proxy is carrying now: requests in flight per host (and per host and model,
against its slots), and the routes' policies with their state (each route's round-robin
turn, where ``cache_affinity`` conversations went). The proxy changes it; the pages and
metrics read it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from crossbar.queueing.queue import FairQueue
from crossbar.routing.allowance import LoadBudget
from crossbar.routing.placement import Occupancy
from crossbar.routing.policies import Policies

MAX_LAST_USED = 4096
"""Host and model pairs whose last use is kept: a lab's hosts times its models."""


class Traffic:
    """Counters kept as plain dicts: they are read and written on every request."""

    def __init__(
        self,
        hosts: Iterable[str],
        routes: Iterable[str],
        slots: Mapping[str, int] | None = None,
        shared: bool = False,
    ) -> None:
        self.in_flight: dict[str, int] = dict.fromkeys(hosts, 0)
        """This process's requests in flight per host."""
        self.busy: dict[tuple[str, str | None], int] = {}
        """This process's requests in flight per host and model (a model's slots are its
        own in router mode); an entry goes with its last request, so a client's made-up
        model names cannot grow it."""
        self.others: dict[tuple[str, str | None], int] = {}
        """``shared``: the slots the other workers hold, per host and model, as worker 0
        last told (:mod:`crossbar.sharing`); empty alone, or while worker 0 is not heard."""
        self.fleet_in_flight = dict(self.in_flight) if shared else self.in_flight
        """Requests in flight per host, this process's and the others' (without
        ``shared``, the same dict as :attr:`in_flight`): what choosing a host reads."""
        self.fleet_busy = {} if shared else self.busy
        """As :attr:`busy`, with the others' slots: what "is this host full" reads."""
        self.last_used: dict[tuple[str, str | None], float] = {}
        """When each host last started or ended a request for each model (the clock's
        seconds): how long a loaded model has been idle. Held to :data:`MAX_LAST_USED`."""
        self.slots: dict[str, int] = dict(slots or {})
        """Each host's ``slots:`` from the config."""
        self.usage = Occupancy(self.fleet_busy, self.last_used, self.slots)
        """A live view of both, for the policies' choice of where to load a model."""
        self.policies = Policies(routes, slots, self.usage)
        """One of each policy, with its state; a route asks its own."""
        self.queue: FairQueue[Any] = FairQueue()
        """Requests waiting in crossbar for a slot (:mod:`crossbar.queueing.waits`): it
        outlives a reload, as they do."""

        self.loads = LoadBudget()
        """Model loads each key's requests caused lately (``max_loads_per_minute``): it
        outlives a reload, as the queue does."""
        self.leaving: dict[str, Callable[[str], None]] = {}
        """Hosts gone from the config that still carry requests, each with what to call
        once its last one ends."""
        self.changed: Callable[[], None] | None = None
        """Called after every :meth:`move` (shared: worker 0 is told this process's counts)."""

    def set_hosts(
        self,
        hosts: Iterable[str],
        routes: Iterable[str],
        slots: Mapping[str, int],
        gone: Callable[[str], None],
    ) -> list[str]:
        """Take a reloaded config's hosts and routes, in place (requests in flight keep
        counting here). A host no longer configured is dropped at once when idle, or
        left counting until its last request ends, then ``gone(name)`` is called.
        Returns the hosts left counting."""
        hosts = list(hosts)
        for name in hosts:
            self.in_flight.setdefault(name, 0)
            self.leaving.pop(name, None)  # configured again
        left = []
        for name in [n for n in self.in_flight if n not in hosts]:
            if self.in_flight[name]:
                self.leaving[name] = gone
                left.append(name)
            else:
                del self.in_flight[name]
                self.leaving.pop(name, None)
        self.slots.clear()  # in place: the usage view reads it
        self.slots.update(slots)
        self.policies.reload(routes, slots)
        self.set_others(self.others)
        return left

    def set_others(self, others: Mapping[tuple[str, str | None], int]) -> None:
        """The other workers' slots in use now (per host and model): the fleet's counts
        become this process's plus theirs, on the hosts this config has."""
        self.others = dict(others)
        fleet_busy, fleet_in_flight = self.fleet_busy, self.fleet_in_flight
        if fleet_busy is self.busy:
            return  # not shared: nothing else is counted
        fleet_busy.clear()  # in place: the usage view and the policies read them
        fleet_busy.update(self.busy)
        fleet_in_flight.clear()
        fleet_in_flight.update(self.in_flight)
        for (host, model), count in self.others.items():
            if host in fleet_in_flight and count > 0:
                fleet_busy[host, model] = fleet_busy.get((host, model), 0) + count
                fleet_in_flight[host] += count

    def move(
        self, old: str | None, new: str | None, model: str | None = None, now: float | None = None
    ) -> None:
        """A request for ``model`` leaves host ``old`` (if any) for host ``new`` (if any),
        at ``now`` (when given: ``old``'s last use of the model; while one is in flight,
        the model is busy there, and its last use is not read)."""
        busy = self.busy
        if old is not None and now is not None:
            self._used(old, model, now)
        if old is not None:
            self.in_flight[old] -= 1
            left = busy[old, model] - 1
            if left:
                busy[old, model] = left
            else:
                del busy[old, model]
            if old in self.leaving and not self.in_flight[old]:
                del self.in_flight[old]
                self.leaving.pop(old)(old)
        if new is not None:
            self.in_flight[new] += 1
            busy[new, model] = busy.get((new, model), 0) + 1
        if self.fleet_busy is not busy:
            self._fleet_move(old, new, model)
        if self.changed is not None:
            self.changed()

    def _fleet_move(self, old: str | None, new: str | None, model: str | None) -> None:
        """:meth:`move` in the fleet's counts (shared only)."""
        fleet_busy, fleet_in_flight = self.fleet_busy, self.fleet_in_flight
        if old is not None:
            if old in self.in_flight:
                fleet_in_flight[old] = fleet_in_flight.get(old, 1) - 1
            else:
                fleet_in_flight.pop(old, None)  # gone with its last request
            left = fleet_busy.get((old, model), 1) - 1
            if left > 0:
                fleet_busy[old, model] = left
            else:
                fleet_busy.pop((old, model), None)
        if new is not None:
            fleet_in_flight[new] = fleet_in_flight.get(new, 0) + 1
            fleet_busy[new, model] = fleet_busy.get((new, model), 0) + 1

    def _used(self, host: str, model: str | None, now: float) -> None:
        last = self.last_used
        last.pop((host, model), None)  # re-inserted last: the dict stays oldest first
        last[host, model] = now
        if len(last) > MAX_LAST_USED:  # clients' made-up model names: the oldest idle go
            idle = [k for k in last if k not in self.busy][: len(last) - MAX_LAST_USED // 2]
            for key in idle:
                del last[key]

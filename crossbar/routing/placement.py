"""Where a model loaded on no healthy host of a group is loaded: the cheapest place. Pure.

A llama-server router loads the model a request names, and when it already runs
``max_instances`` models it evicts its least recently used *idle* one, throwing away that
model's KV and prompt cache; if all of them are busy the request waits until one is idle.
So, for a model that no healthy host of the group has loaded, the hosts that know it rank:

0. a host loading it already (listed ``loading``, or crossbar has requests for it there in
   flight): further requests wait for that load rather than start a second one elsewhere;
1. a host with a free instance;
2. a host with an idle model to evict, the one whose victim has been idle longest first
   (a model is a victim only once idle for the route's ``min_idle_before_evict``);
3. a host whose room is unknown;
4. a host whose loaded models are all busy (the request would wait there);
5. a host whose idle models were all used within ``min_idle_before_evict`` (an agent
   thinking between turns: evicting its model costs it a reload and its prompt cache);
6. a host that loads nothing by itself (``models_autoload: false``);
7. a host where loading the model failed lately (backed off: see
   :mod:`crossbar.polling.loadfailures`).

The best rank's hosts are left, in route order, for the route's policy to break the tie.
With no room known on any of them (single-model hosts, routers that do not tell), placement
says nothing: the policy picks as it always has.

With ``spillover: true`` a route starts one more copy of a model whose hosts have every slot
busy, rather than make the request wait (:func:`spill_places`): only where a load is cheap
(ranks 1 and 2), never where it failed lately or would evict a model used lately.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from crossbar.polling.health import HostState

Key = tuple[str, str | None]
"""A host and a model."""

LOADING, FREE, EVICTS, UNKNOWN, BUSY, RECENT, NO_AUTOLOAD, FAILED = range(8)


@attrs.frozen
class Occupancy:
    """What crossbar carries, per host and model: a live view, read at each choice."""

    busy: Mapping[Key, int] = attrs.field(factory=dict)
    """Requests in flight."""
    last_used: Mapping[Key, float] = attrs.field(factory=dict)
    """When a request last left the host (ended, or failed over); absent: none has since
    crossbar started. Read only while none is in flight there (see :meth:`idle`)."""
    slots: Mapping[str, int] = attrs.field(factory=dict)
    """Each host's ``slots:`` from the config (else what it said of each model counts)."""

    def full(self, state: HostState, model: str | None) -> bool:
        """Whether every slot ``state``'s host runs for ``model`` is taken: its ``slots:``
        from the config, else what it said of the model; never when unknown."""
        slots = self.slots.get(state.name) or state.slots.get(model or "")
        return slots is not None and self.busy.get((state.name, model), 0) >= slots

    def idle(self, host: str, model: str, now: float) -> float:
        """Seconds ``model`` has had nothing in flight on ``host``; ``inf`` when crossbar
        has never sent it a request."""
        if self.busy.get((host, model)):
            return 0.0
        last = self.last_used.get((host, model))
        return math.inf if last is None else max(0.0, now - last)

    def running(self, state: HostState) -> set[str]:
        """The models ``state``'s host runs or is loading, as far as crossbar can tell:
        what it listed, and any it knows that crossbar has requests for in flight there."""
        models = set(state.loaded) | set(state.loading)
        known = set(state.known)
        for (host, model), count in self.busy.items():
            if host == state.name and count and model is not None and model in known:
                models.add(model)
        return models


@attrs.frozen
class LoadCost:
    """A host that would load the model, and what that costs."""

    host: str
    rank: int
    evicts: str | None = None
    """The model the router would evict for it (its least recently used idle one)."""
    idle: float | None = None
    """Seconds that model has been idle (``inf``: never used through crossbar)."""
    free: int | None = None
    """Instances free before the load, where known."""
    instances: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"host": self.host, "why": _WHY[self.rank]}
        if self.evicts is not None:
            doc["evicts"] = self.evicts
            idle = self.idle
            doc["evicts_idle_seconds"] = None if idle is None or math.isinf(idle) else round(idle)
        if self.instances is not None:
            doc["instances"] = self.instances
            doc["free"] = self.free
        return doc


_WHY = (
    "loading",
    "free instance",
    "evicts idle model",
    "room unknown",
    "all busy",
    "idle models used lately",
    "no autoload",
    "failed to load lately",
)


def rank(
    state: HostState, model: str, usage: Occupancy, now: float, min_idle: float = 0.0
) -> LoadCost:
    """How cheaply ``state``'s host would load ``model`` (not loaded there); a model idle
    for less than ``min_idle`` seconds is never the one evicted for it."""
    name = state.name
    if state.load_failures.backed_off(model, now):
        return LoadCost(name, FAILED)
    running = usage.running(state)
    if model in state.loading or model in running:
        return LoadCost(name, LOADING)
    if state.autoload is False:
        return LoadCost(name, NO_AUTOLOAD)
    instances = state.max_instances
    if instances is None:
        return LoadCost(name, UNKNOWN)
    free = instances - len(running)
    if free > 0:
        return LoadCost(name, FREE, free=free, instances=instances)
    idle = [
        (usage.idle(name, m, now), m) for m in sorted(state.loaded) if not usage.busy.get((name, m))
    ]
    if not idle:
        return LoadCost(name, BUSY, free=0, instances=instances)
    seconds, victim = max(idle, key=lambda pair: pair[0])  # the least recently used idle one
    kind = EVICTS if seconds >= min_idle else RECENT
    return LoadCost(name, kind, victim, seconds, 0, instances)


def spill_places(
    hosts: Sequence[HostState],
    model: str | None,
    usage: Occupancy,
    now: float,
    min_idle: float = 0.0,
) -> list[LoadCost]:
    """Where one more copy of ``model`` may start (``spillover: true``): the healthy
    ``hosts`` of the route, when every one that has it loaded has all its slots for it
    busy. Only a host with a free instance or a model idle for ``min_idle`` to evict (never
    a busy one, nor one where the model failed to load lately); none while a load of it
    runs on any of them: one load at a time per model."""
    if model is None:
        return []
    loaded = [s for s in hosts if model in s.loaded]
    if not loaded or not all(usage.full(s, model) for s in loaded):
        return []
    loads = [rank(s, model, usage, now, min_idle) for s in hosts if model not in s.loaded]
    if any(load.rank == LOADING for load in loads):
        return []
    tier = [load for load in loads if load.rank in (FREE, EVICTS)]
    best = min((load.rank for load in tier), default=None)
    return [load for load in tier if load.rank == best]


def cheapest(
    group: Sequence[HostState],
    model: str | None,
    usage: Occupancy,
    now: float,
    min_idle: float = 0.0,
) -> list[LoadCost] | None:
    """The group's hosts that would load ``model`` most cheaply, in group order; ``None``
    when placement has nothing to say: no model, the model loaded on a host of the group,
    or no host of the group with a known room and none where it failed to load lately
    (the policy then picks as before). ``min_idle``: the route's ``min_idle_before_evict``."""
    if model is None or not group or model in group[0].loaded:  # most requests: at once
        return None
    if any(model in s.loaded for s in group):
        return None
    unknown = all(s.max_instances is None for s in group)
    if unknown and not any(s.load_failures.backed_off(model, now) for s in group):
        return None
    loads = [rank(s, model, usage, now, min_idle) for s in group]
    best = min(load.rank for load in loads)
    tier = [load for load in loads if load.rank == best]
    if best == EVICTS:
        longest = max(load.idle or 0.0 for load in tier)
        tier = [load for load in tier if load.idle == longest]
    return tier

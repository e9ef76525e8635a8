"""How a route picks its host: one object per policy, each with its own state, in one
registry. The proxy and the status pages ask the route's policy the same question, so the
page's "where a request goes now" is where the next request really goes.

A policy picks within the route's best group (:func:`~crossbar.routing.groups.best_group`:
the healthy hosts with the model loaded, else those that know it, else all healthy ones;
when none has it loaded and the hosts' room is known, only the cheapest places to load it,
:func:`~crossbar.routing.placement.cheapest`):

- ``priority``: the first, in the route's order;
- ``round_robin``: each route's turn, advanced by each request's first try;
- ``least_busy``: the one with fewest requests in flight (ties: route order);
- ``cache_affinity``: a request of a known conversation where
  :class:`~crossbar.routing.affinity.Conversations` places it; one without, as ``least_busy``.

With no healthy host left, a route with ``when_all_down: try_all`` takes the next of its
hosts not yet tried, whatever the policy. Pure rules, no I/O: time comes from the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

import attrs

from crossbar.config import POLICIES, RouteConfig
from crossbar.polling.health import HostState
from crossbar.routing.affinity import Conversations, Placement
from crossbar.routing.groups import best_group
from crossbar.routing.placement import LoadCost, Occupancy, cheapest

Group = Sequence[HostState]
"""A route's best group: healthy hosts, in route order."""
Counts = Mapping[str, int]
"""Requests in flight per host."""


@attrs.frozen
class Conversation:
    """The conversation a request continues: its key, and its turn where the API tells."""

    key: bytes
    turn: int | None = None
    """The answers already in it (0 on its first turn); ``None`` when the API has no turns."""
    prefix: bytes | None = None
    """The digest of what new conversations share: the model, the system prompt and the
    tools, no user message (``None``: the API has none)."""


@attrs.frozen
class Ask:
    """What a policy is asked: a host for one request."""

    model: str | None
    """The model the choice goes by: the body's, else the route's default."""
    conversation: Conversation | None = None
    exclude: Sequence[str] = ()
    """Hosts tried already for this request (a failover): never chosen again."""
    now: float = 0.0


@attrs.frozen
class Choice:
    host: str
    placement: Placement | None = None
    """Where ``cache_affinity`` placed the request's conversation, and why."""
    load: LoadCost | None = None
    """When the model is loaded on no healthy host of the group: what loading it there costs."""


class Policy:
    """Picks one host of a route's best group. ``commit`` is ``False`` when the pages ask:
    the answer is the same, and the policy's state does not move."""

    name: ClassVar[str]
    reads_conversations: ClassVar[bool] = False
    """Whether the proxy should find each request's conversation for it (a cost per request)."""
    usage: Occupancy = Occupancy()
    """What crossbar carries per host and model (set by :class:`Policies`): where a model
    loaded nowhere is cheapest to load (:mod:`crossbar.routing.placement`)."""

    def last_host(self, key: bytes) -> str | None:
        """Where the conversation ``key``'s last turn went, for a policy that places by
        conversation and placed it; ``None`` otherwise."""
        return None

    def choose(
        self,
        route: RouteConfig,
        ask: Ask,
        states: Mapping[str, HostState],
        in_flight: Mapping[str, int],
        *,
        commit: bool = True,
    ) -> Choice | None:
        """The host for ``ask`` on ``route``; ``None`` when none is left."""
        if commit and ask.conversation is not None:
            placed = self.place(route, ask, ask.conversation, states, in_flight)
            if placed is not None:
                return Choice(placed.host, placed)
        group, loads = self.group(route, ask.model, states, ask.exclude, ask.now)
        if group:
            picked = self.pick(route, group, in_flight, commit and not ask.exclude)
            return Choice(picked, load=next((x for x in loads if x.host == picked), None))
        if route.when_all_down == "try_all":
            # Only hosts still in the table: a route of the config before a reload may
            # name one that is gone.
            exclude = ask.exclude
            host = next((h for h in route.hosts if h not in exclude and h in states), None)
            return None if host is None else Choice(host)
        return None

    def group(
        self,
        route: RouteConfig,
        model: str | None,
        states: Mapping[str, HostState],
        exclude: Sequence[str],
        now: float,
    ) -> tuple[list[HostState], list[LoadCost]]:
        """The best group; when it has the model loaded nowhere, only its cheapest places
        to load it (with what each costs)."""
        group = best_group(route.hosts, model, states, exclude)
        loads = cheapest(group, model, self.usage, now, route.min_idle_before_evict) or []
        if loads:
            cheap = {load.host for load in loads}
            group = [s for s in group if s.name in cheap]
        return group, loads

    def pick(self, route: RouteConfig, group: Group, in_flight: Counts, moves: bool) -> str:
        """One host of ``group`` (never empty, in route order); ``moves``: a request's
        first try, asked by the proxy (not the pages), so the policy's state moves."""
        return group[0].name

    def place(
        self,
        route: RouteConfig,
        ask: Ask,
        conversation: Conversation,
        states: Mapping[str, HostState],
        in_flight: Counts,
    ) -> Placement | None:
        """Where a request of a known conversation goes; ``None``: as any other request."""
        return None

    @classmethod
    def make(cls, routes: Iterable[str], slots: Mapping[str, int]) -> Policy:
        """The policy for a config's routes and its hosts' slots."""
        return cls()

    def reload(self, routes: Iterable[str], slots: Mapping[str, int]) -> None:
        """A reloaded config's routes and hosts' slots; state of what stays is kept."""


class Priority(Policy):
    name = "priority"


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, routes: Iterable[str] = ()) -> None:
        self.turns: dict[str, int] = dict.fromkeys(routes, 0)
        """Each route's turn: how many requests it has sent out."""

    @classmethod
    def make(cls, routes: Iterable[str], slots: Mapping[str, int]) -> Policy:
        return cls(routes)

    def pick(self, route: RouteConfig, group: Group, in_flight: Counts, moves: bool) -> str:
        turn = self.turns.get(route.name, 0)  # a route reloaded away: no turns
        if moves and route.name in self.turns:
            self.turns[route.name] = turn + 1
        return group[turn % len(group)].name

    def reload(self, routes: Iterable[str], slots: Mapping[str, int]) -> None:
        self.turns = {name: self.turns.get(name, 0) for name in routes}


class LeastBusy(Policy):
    name = "least_busy"

    def pick(self, route: RouteConfig, group: Group, in_flight: Counts, moves: bool) -> str:
        return min(group, key=lambda s: in_flight.get(s.name, 0)).name


class CacheAffinity(LeastBusy):
    name = "cache_affinity"
    reads_conversations = True

    def __init__(self, slots: Mapping[str, int] | None = None) -> None:
        self.conversations = Conversations(slots)
        """One table for every ``cache_affinity`` route: a host's slots are shared by
        the conversations of all the routes it serves."""

    @classmethod
    def make(cls, routes: Iterable[str], slots: Mapping[str, int]) -> Policy:
        return cls(slots)

    def place(
        self,
        route: RouteConfig,
        ask: Ask,
        conversation: Conversation,
        states: Mapping[str, HostState],
        in_flight: Counts,
    ) -> Placement | None:
        """Where the conversation goes, within the best group. Hosts tried already are
        passed over; when they were the whole best group, the next best group is placed
        in. ``None`` when no healthy host is left."""
        key, turn, now, exclude = conversation.key, conversation.turn, ask.now, ask.exclude
        max_load = route.affinity_max_load
        group = [s.name for s in self.group(route, ask.model, states, (), now)[0]]
        placed = self.conversations.place(key, group, in_flight, max_load, now, exclude, turn)
        if placed is None and group:
            rest = [s.name for s in self.group(route, ask.model, states, exclude, now)[0]]
            if rest:
                placed = self.conversations.place(key, rest, in_flight, max_load, now, turn=turn)
        return placed

    def last_host(self, key: bytes) -> str | None:
        return self.conversations.host_of(key)

    def reload(self, routes: Iterable[str], slots: Mapping[str, int]) -> None:
        self.conversations.set_slots(slots)


REGISTRY: Mapping[str, type[Policy]] = {
    policy.name: policy for policy in (Priority, RoundRobin, LeastBusy, CacheAffinity)
}
"""Every policy by its name in ``crossbar.yaml``: a new policy is a class and a name here."""
assert tuple(REGISTRY) == POLICIES, "the config's policy names and the registry differ"


def places_conversations(route: RouteConfig) -> bool:
    """Whether the route's policy places requests by their conversation."""
    return REGISTRY[route.policy].reads_conversations


class Policies:
    """One of each policy, with its state, for all the routes of the config."""

    def __init__(
        self,
        routes: Iterable[str] = (),
        slots: Mapping[str, int] | None = None,
        usage: Occupancy | None = None,
    ):
        routes = list(routes)
        self._by_name = {name: cls.make(routes, slots or {}) for name, cls in REGISTRY.items()}
        if usage is not None:
            for policy in self._by_name.values():
                policy.usage = usage

    def of(self, route: RouteConfig) -> Policy:
        """The route's policy."""
        return self._by_name[route.policy]

    def named(self, name: str) -> Policy:
        return self._by_name[name]

    def reload(self, routes: Iterable[str], slots: Mapping[str, int]) -> None:
        routes = list(routes)
        for policy in self._by_name.values():
            policy.reload(routes, slots)

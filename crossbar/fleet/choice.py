"""Which host serves a request: pure rules over the health table, no I/O.

The proxy and the status pages both ask here, so the page can never disagree with
where traffic really goes.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

from crossbar.config import Policy, RouteConfig
from crossbar.fleet.affinity import Conversations, Placement
from crossbar.fleet.state import HostState


def best_group(
    hosts: Sequence[str],
    model: str | None,
    states: Mapping[str, HostState],
    exclude: Container[str] = (),
) -> list[HostState]:
    """The healthy hosts with ``model`` loaded (no model swap on the GPU), else those
    that know it, else all healthy ones; in the route's order."""
    healthy = [
        states[name]
        for name in hosts
        if name not in exclude and name in states and states[name].healthy
    ]
    if model is None:
        return healthy
    group = [s for s in healthy if model in s.loaded] or [s for s in healthy if model in s.known]
    return group or healthy


def choose(
    hosts: Sequence[str],
    model: str | None,
    states: Mapping[str, HostState],
    *,
    policy: Policy = "priority",
    in_flight: Mapping[str, int] | None = None,
    turn: int = 0,
    exclude: Container[str] = (),
) -> str | None:
    """The host to send a request for ``model`` to; ``None`` when no host is healthy.

    The policy picks within the :func:`best_group`: ``priority`` the first in the route's
    order, ``round_robin`` the ``turn``-th, ``least_busy`` the one with fewest requests
    in flight (ties: route order). ``cache_affinity`` places a request of a known
    conversation with :func:`place`; one with no conversation (no messages, not a
    completion) goes as for ``least_busy``.
    """
    group = best_group(hosts, model, states, exclude)
    if not group:
        return None
    if policy == "round_robin":
        return group[turn % len(group)].name
    if policy in ("least_busy", "cache_affinity") and in_flight is not None:
        return min(group, key=lambda s: in_flight.get(s.name, 0)).name
    return group[0].name


def choose_for_route(
    route: RouteConfig,
    model: str | None,
    states: Mapping[str, HostState],
    in_flight: Mapping[str, int],
    turn: int,
    exclude: Container[str] = (),
) -> str | None:
    """:func:`choose` under the route's own rules, ``when_all_down: try_all`` included:
    with no healthy host left, the next host of the route not yet tried."""
    host = choose(
        route.hosts,
        model,
        states,
        policy=route.policy,
        in_flight=in_flight,
        turn=turn,
        exclude=exclude,
    )
    if host is None and route.when_all_down == "try_all":
        # Only hosts still in the table: a route of the config before a reload may name
        # one that is gone.
        host = next((h for h in route.hosts if h not in exclude and h in states), None)
    return host


def place(
    route: RouteConfig,
    model: str | None,
    states: Mapping[str, HostState],
    in_flight: Mapping[str, int],
    conversations: Conversations,
    key: bytes,
    now: float,
    exclude: Sequence[str] = (),
    turn: int | None = None,
) -> Placement | None:
    """Where a request of conversation ``key`` (at ``turn``) goes on a ``cache_affinity`` route, as
    :class:`~crossbar.fleet.affinity.Conversations` rules it, within the best group.
    Hosts tried already are passed over; when they were the whole best group, the next
    best group is placed in. ``None`` when no healthy host is left."""
    group = [s.name for s in best_group(route.hosts, model, states)]
    max_load = route.affinity_max_load
    placed = conversations.place(key, group, in_flight, max_load, now, exclude, turn)
    if placed is None and group:
        rest = [s.name for s in best_group(route.hosts, model, states, exclude)]
        if rest:
            placed = conversations.place(key, rest, in_flight, max_load, now, turn=turn)
    return placed


def routes_down(routes: Mapping[str, RouteConfig], states: Mapping[str, HostState]) -> list[str]:
    """The routes that have no healthy host, in config order."""
    return [
        name
        for name, route in routes.items()
        if not any(h in states and states[h].healthy for h in route.hosts)
    ]

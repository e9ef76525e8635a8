"""Which host serves a request: pure rules over the health table, no I/O.

The proxy and the status pages both ask here, so the page can never disagree with
where traffic really goes.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

from crossbar.config import Policy, RouteConfig
from crossbar.fleet.state import HostState


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

    Healthy hosts are grouped: those with the model loaded (no model swap on the GPU),
    else those that know it, else all healthy ones. The policy picks within the best
    group: ``priority`` the first in the route's order, ``round_robin`` the ``turn``-th,
    ``least_busy`` the one with fewest requests in flight (ties: route order).
    """
    healthy = [
        states[name]
        for name in hosts
        if name not in exclude and name in states and states[name].healthy
    ]
    group = healthy
    if model is not None:
        group = [s for s in healthy if model in s.loaded] or [
            s for s in healthy if model in s.known
        ]
        group = group or healthy
    if not group:
        return None
    if policy == "round_robin":
        return group[turn % len(group)].name
    if policy == "least_busy" and in_flight is not None:
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
        host = next((h for h in route.hosts if h not in exclude), None)
    return host


def routes_down(routes: Mapping[str, RouteConfig], states: Mapping[str, HostState]) -> list[str]:
    """The routes that have no healthy host, in config order."""
    return [
        name
        for name, route in routes.items()
        if not any(h in states and states[h].healthy for h in route.hosts)
    ]

"""Which hosts may serve a request, and which routes have none: pure rules over the
health table, no I/O. A route's policy (:mod:`crossbar.routing.policies`) picks within the
best group."""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

from crossbar.config import RouteConfig
from crossbar.polling.health import HostState


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


def no_host(route: RouteConfig, states: Mapping[str, HostState], tried: Sequence[str]) -> str:
    """Why no host of ``route`` is left for a request that has tried ``tried``, in words
    that are true: none is healthy, or every healthy one failed it already."""
    healthy = [h for h in route.hosts if h in states and states[h].healthy]
    if healthy and all(h in tried for h in healthy):
        return "no healthy host left: each one failed this request before answering"
    return "no healthy host"


def routes_down(routes: Mapping[str, RouteConfig], states: Mapping[str, HostState]) -> list[str]:
    """The routes that have no healthy host, in config order."""
    return [
        name
        for name, route in routes.items()
        if not any(h in states and states[h].healthy for h in route.hosts)
    ]

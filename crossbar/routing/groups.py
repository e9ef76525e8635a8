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


def served_model(
    route: RouteConfig, model: str | None, states: Mapping[str, HostState]
) -> str | None:
    """The model a request naming ``model`` runs as on ``route``, which its slot counts
    against and its wait is for: ``model`` itself when a healthy host of the route knows
    it (a router answers a name it does not know with an error, itself); else the one
    model of the route's first healthy host that lists only one (a single-model
    llama-server answers any name, or none, with its one model); else ``model``."""
    healthy = [states[h] for h in route.hosts if h in states and states[h].healthy]
    if model is not None and any(model in s.known for s in healthy):
        return model
    return next((s.known[0] for s in healthy if len(s.known) == 1), model)


def routes_down(routes: Mapping[str, RouteConfig], states: Mapping[str, HostState]) -> list[str]:
    """The routes that have no healthy host, in config order."""
    return [
        name
        for name, route in routes.items()
        if not any(h in states and states[h].healthy for h in route.hosts)
    ]


REASON_CHARS = 120
"""A host's last error is cut to this length in a client's 503."""


def no_healthy_host(
    route: str,
    hosts: Sequence[str],
    states: Mapping[str, HostState],
    tried: Container[str] = (),
    full: Container[str] = (),
    small: Container[str] = (),
) -> str:
    """The 503 of a request ``route`` found no host for, naming each of its ``hosts`` and
    why it is out: ``no healthy host for route lab: gpu-a down (models: HTTP 404), gpu-b
    not polled yet``. ``tried``: the hosts it failed on already; ``full``: those whose
    every slot is busy; ``small``: those whose window is too small for its prompt."""
    said = []
    for name in hosts:
        state = states.get(name)
        if name in tried:
            why = "failed this request"
        elif name in full:
            why = "every slot busy"
        elif name in small:
            why = "window too small for this prompt"
        elif state is None or not state.polled:
            why = "not polled yet"
        elif state.healthy:
            why = "healthy"
        else:
            err = state.last_err
            err = err if len(err) <= REASON_CHARS else err[: REASON_CHARS - 3] + "..."
            why = f"down ({err})" if err else "down"
        said.append(f"{name} {why}")
    return f"no healthy host for route {route}: {', '.join(said)}"

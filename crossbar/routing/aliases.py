"""Which model of the fleet a name a client sends stands for: a route's ``aliases:``,
glob patterns of the names agents send (``claude-*``) each mapped to a model. Pure rules
over the health table, no I/O.

An id a host of the route lists always wins over a pattern, so that an alias can never
hide a model the fleet has; then the first pattern that matches, in the order the config
writes them. Matching is case-sensitive (``fnmatchcase``: ``*``, ``?``, ``[ab]``), as
``models:`` matches; a pattern's own text stands for its target too, so that a client
that picked an alias from ``/v1/models`` is served.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from crossbar.config import RouteConfig
from crossbar.polling.health import HostState


def real_model(route: RouteConfig, model: str, states: Mapping[str, HostState]) -> str:
    """The model a request naming ``model`` is for on ``route``: ``model`` itself when a
    host of the route lists it (healthy or not), or it is the route's default or an alias's
    target; else the target of the first alias whose pattern matches it; else ``model``
    (answered as any unknown model is)."""
    aliases = route.aliases
    if not aliases or model == route.default_model:
        return model
    if any(model == target for _, target in aliases):
        return model
    for name in route.hosts:
        state = states.get(name)
        if state is not None and (model in state.known or model in state.loaded):
            return model
    for pattern, target in aliases:
        if model == pattern or fnmatchcase(model, pattern):
            return target
    return model

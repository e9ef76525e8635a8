"""Pure routing decisions: which route a path names, which model a body asks for,
and which host should serve it. No I/O here, so every rule is cheap to test."""

from __future__ import annotations

import json
from collections.abc import Container, Mapping, Sequence

import attrs

from crossbar.health import HostState

ALLOWED_EXACT = frozenset({b"/health", b"/props"})


@attrs.frozen
class Target:
    route: str
    rest: bytes
    """The path after the route segment, always starting with ``/``."""
    query: bytes
    """The query string without ``?``, or empty."""


class BadTarget(Exception):
    """``str()`` is the error message; ``status`` the HTTP code to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_target(uri: bytes) -> Target:
    """Split ``/<route>/<rest>?<query>``; the route segment is never decoded."""
    path, _, query = uri.partition(b"?")
    if not path.startswith(b"/"):
        raise BadTarget(400, "missing route")
    route, slash, rest = path[1:].partition(b"/")
    if not route:
        raise BadTarget(400, "missing route")
    try:
        name = route.decode("ascii")
    except UnicodeDecodeError:
        raise BadTarget(404, "unknown route") from None
    return Target(route=name, rest=b"/" + rest if slash else b"/", query=query)


def allowed_path(rest: bytes) -> bool:
    """Only the OpenAI API and llama-server's harmless ``/health`` and ``/props``."""
    return rest.startswith(b"/v1/") or rest in ALLOWED_EXACT


@attrs.frozen
class Peek:
    model: str | None
    """The top-level ``"model"`` string, when the body is a JSON object naming one."""
    missing: bool
    """The body is a JSON object with no top-level ``"model"`` key at all."""


_NOTHING = Peek(model=None, missing=False)


def peek_model(body: bytes) -> Peek:
    """Find the top-level ``"model"`` of a JSON body; anything else is not an error."""
    start = body.lstrip()[:1]
    if start != b"{":
        return _NOTHING
    try:
        doc = json.loads(body)
    except ValueError:
        return _NOTHING
    if not isinstance(doc, dict):
        return _NOTHING
    if "model" not in doc:
        return Peek(model=None, missing=True)
    model = doc["model"]
    return Peek(model=model if isinstance(model, str) and model else None, missing=False)


def with_model(body: bytes, model: str) -> bytes:
    """Add ``"model"`` right after the opening brace, keeping every other byte."""
    brace = body.index(b"{") + 1
    rest = body[brace:]
    field = b'"model":' + json.dumps(model).encode()
    empty = rest.strip() == b"}"
    return body[:brace] + field + (b"" if empty else b",") + rest


def choose(
    hosts: Sequence[str],
    model: str | None,
    states: Mapping[str, HostState],
    *,
    policy: str = "priority",
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

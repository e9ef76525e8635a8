"""What the proxy is carrying now: requests in flight per host, each route's
round-robin turn, and where ``cache_affinity`` conversations went. The proxy changes it;
the choice rules, pages and metrics read it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

from crossbar.fleet.affinity import AffinityOutcome, Conversations


class Traffic:
    """Counters kept as plain dicts: they are read and written on every request."""

    def __init__(
        self, hosts: Iterable[str], routes: Iterable[str], slots: Mapping[str, int] | None = None
    ) -> None:
        self.in_flight: dict[str, int] = dict.fromkeys(hosts, 0)
        self.turns: dict[str, int] = dict.fromkeys(routes, 0)
        self.conversations = Conversations(slots)
        """One table for every ``cache_affinity`` route: a host's slots are shared by
        the conversations of all the routes it serves."""

    def move(self, old: str | None, new: str | None) -> None:
        """A request leaves host ``old`` (if any) for host ``new`` (if any)."""
        if old is not None:
            self.in_flight[old] -= 1
        if new is not None:
            self.in_flight[new] += 1


@attrs.frozen
class Outcome:
    """One proxied request, as it ended."""

    route: str
    """The route's name, or ``-`` when the path named none that exists."""
    host: str | None
    """The last host tried; ``None`` when no host was (bad path, no healthy host)."""
    status: int
    """The status sent to the client; 499 when the client left before any answer."""
    seconds: float
    first_byte: float | None
    """Seconds until the host's status line, if one came."""
    sent: int
    """Bytes of the host's answer body relayed to the client."""
    model: str | None = None
    """The model the request's body asked for (or the route's default filled into it);
    ``None`` for a request that asks for no model."""
    affinity: AffinityOutcome | None = None
    """How ``cache_affinity`` placed the request's conversation; ``None`` for a request
    with no conversation or on a route of another policy."""


class ProxyObserver(Protocol):
    """Told of every proxied request as it ends (the metrics are one)."""

    def request_done(self, outcome: Outcome) -> None: ...


class Observers:
    """Several observers behind the proxy's one observer slot, each told in turn."""

    def __init__(self, *observers: ProxyObserver) -> None:
        self._calls = tuple(observer.request_done for observer in observers)

    def request_done(self, outcome: Outcome) -> None:
        for call in self._calls:
            call(outcome)

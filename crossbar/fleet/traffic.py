"""What the proxy is carrying now: requests in flight per host, each route's
round-robin turn, and where ``cache_affinity`` conversations went. The proxy changes it;
the choice rules, pages and metrics read it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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

        self.leaving: dict[str, Callable[[str], None]] = {}
        """Hosts gone from the config that still carry requests, each with what to call
        once its last one ends."""

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
        routes = list(routes)
        for name in routes:
            self.turns.setdefault(name, 0)
        for name in [n for n in self.turns if n not in routes]:
            del self.turns[name]
        self.conversations.set_slots(slots)
        return left

    def move(self, old: str | None, new: str | None) -> None:
        """A request leaves host ``old`` (if any) for host ``new`` (if any)."""
        if old is not None:
            self.in_flight[old] -= 1
            if old in self.leaving and not self.in_flight[old]:
                del self.in_flight[old]
                self.leaving.pop(old)(old)
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

"""What the proxy is carrying now: requests in flight per host, and each route's
round-robin turn. The proxy changes it; the choice rules, pages and metrics read it."""

from __future__ import annotations

from collections.abc import Iterable


class Traffic:
    """Counters kept as plain dicts: they are read and written on every request."""

    def __init__(self, hosts: Iterable[str], routes: Iterable[str]) -> None:
        self.in_flight: dict[str, int] = dict.fromkeys(hosts, 0)
        self.turns: dict[str, int] = dict.fromkeys(routes, 0)

    def move(self, old: str | None, new: str | None) -> None:
        """A request leaves host ``old`` (if any) for host ``new`` (if any)."""
        if old is not None:
            self.in_flight[old] -= 1
        if new is not None:
            self.in_flight[new] += 1

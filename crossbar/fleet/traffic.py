"""What the proxy is carrying now: requests in flight per host, and the routes' policies
with their state (each route's round-robin turn, where ``cache_affinity`` conversations
went). The proxy changes it; the pages and metrics read it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from crossbar.fleet.policies import Policies


class Traffic:
    """Counters kept as plain dicts: they are read and written on every request."""

    def __init__(
        self, hosts: Iterable[str], routes: Iterable[str], slots: Mapping[str, int] | None = None
    ) -> None:
        self.in_flight: dict[str, int] = dict.fromkeys(hosts, 0)
        self.policies = Policies(routes, slots)
        """One of each policy, with its state; a route asks its own."""

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
        self.policies.reload(routes, slots)
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

"""Each host's last five minutes: requests, errors and the median time to first byte;
and each ``cache_affinity`` route's: how many turns went to their conversation's home.

The lifetime counters are in the metrics; an admin glancing at the status page wants
*now*. So each host has a ring of 30 buckets of 10 s, fed by every proxied request
(:class:`RecentTraffic` is a :class:`~crossbar.fleet.ProxyObserver`). Memory is fixed
per host whatever the traffic: the ring never grows, and the times to first byte are
counted in a histogram whose bins are the values of two significant digits (10 us to
9900 s), so the median read from it is exact at the two digits the page shows.
Recording costs a dict lookup, a bisect and three increments; the median is found
only when a page asks. Pure: no I/O, the time comes from a clock.
"""

from __future__ import annotations

from bisect import bisect
from collections.abc import Iterable
from itertools import pairwise

import attrs

from crossbar.fleet.record import RequestRecord
from crossbar.fleet.state import Clock

WINDOW_SECONDS = 300
BUCKET_SECONDS = 10
BUCKETS = WINDOW_SECONDS // BUCKET_SECONDS

GRID: tuple[float, ...] = tuple(
    float(f"{mantissa}e{exponent}") for exponent in range(-6, 3) for mantissa in range(10, 100)
)
"""The values a time to first byte is rounded to: two significant digits, 1.0e-5 to 9.9e3 s."""
_NEVER = -(1 << 62)
"""The tick of a bucket never written: outside every window."""
_EDGES = tuple((low + high) / 2 for low, high in pairwise(GRID))
"""Between two neighbours of the grid: ``bisect`` on these rounds to the nearer one."""


@attrs.frozen
class HostRecent:
    """What one host did in the window."""

    requests: int = 0
    errors: int = 0
    """Answers of status 500 or more: the host's own, or the 502/504 crossbar gave when
    it failed. A 499 is the client leaving, not the host failing."""
    ttfb_p50: float | None = None
    """Median seconds to the host's status line (two significant digits); ``None``
    when no request in the window got one."""


class _Bucket:
    __slots__ = ("errors", "requests", "tick", "ttfb")

    def __init__(self) -> None:
        self.tick = _NEVER
        self.requests = 0
        self.errors = 0
        self.ttfb: list[int] = []

    def reset(self, tick: int) -> None:
        self.tick = tick
        self.requests = self.errors = 0
        self.ttfb = [0] * len(GRID)


@attrs.frozen
class RouteAffinity:
    """Where one ``cache_affinity`` route's turns went in the window."""

    turns: int = 0
    """Requests that belonged to a conversation."""
    home: int = 0
    """Of them, those sent to their conversation's home host (``new`` and ``home``)."""

    @property
    def moved(self) -> int:
        return self.turns - self.home

    @property
    def home_share(self) -> float | None:
        """``home`` over ``turns``; ``None`` with no turn in the window."""
        return self.home / self.turns if self.turns else None


class _Turns:
    __slots__ = ("home", "tick", "turns")

    def __init__(self) -> None:
        self.tick = _NEVER
        self.turns = self.home = 0


class RecentTraffic:
    """Rolling per-host counts over the last :data:`WINDOW_SECONDS` (to the 10 s), and
    per-route counts of turns for the ``routes`` given."""

    def __init__(self, hosts: Iterable[str], clock: Clock, routes: Iterable[str] = ()) -> None:
        self._clock = clock
        # Fixed until a reload: a record naming any other host (or none) adds nothing.
        self._rings = {name: [_Bucket() for _ in range(BUCKETS)] for name in hosts}
        self._turns = {name: [_Turns() for _ in range(BUCKETS)] for name in routes}

    def set_hosts(self, hosts: Iterable[str], routes: Iterable[str]) -> None:
        """A reloaded config's hosts and ``cache_affinity`` routes: those that stay keep
        their window, new ones start empty, the others are forgotten."""
        self._rings = {
            name: self._rings.get(name) or [_Bucket() for _ in range(BUCKETS)] for name in hosts
        }
        self._turns = {
            name: self._turns.get(name) or [_Turns() for _ in range(BUCKETS)] for name in routes
        }

    def request_done(self, record: RequestRecord) -> None:
        """Count one ended request; on every request's path, so nothing here sorts."""
        if record.affinity is not None:
            self._count_turn(record)
        ring = self._rings.get(record.host) if record.host is not None else None
        if ring is None:
            return
        tick = int(self._clock.seconds() // BUCKET_SECONDS)
        bucket = ring[tick % BUCKETS]
        if bucket.tick != tick:
            bucket.reset(tick)
        bucket.requests += 1
        if record.status >= 500:
            bucket.errors += 1
        if record.first_byte is not None:
            bucket.ttfb[bisect(_EDGES, record.first_byte)] += 1

    def host(self, name: str) -> HostRecent:
        """One host's window as of now; an unknown host did nothing."""
        ring = self._rings.get(name)
        if ring is None:
            return HostRecent()
        now = int(self._clock.seconds() // BUCKET_SECONDS)
        live = [b for b in ring if now - BUCKETS < b.tick <= now]
        if not live:
            return HostRecent()
        counts = [sum(column) for column in zip(*(b.ttfb for b in live), strict=True)]
        return HostRecent(
            requests=sum(b.requests for b in live),
            errors=sum(b.errors for b in live),
            ttfb_p50=_median(counts),
        )

    def hosts(self) -> dict[str, HostRecent]:
        """Every host's window as of now, in the order the hosts were given."""
        return {name: self.host(name) for name in self._rings}

    def _count_turn(self, record: RequestRecord) -> None:
        ring = self._turns.get(record.route)
        if ring is None:
            return
        tick = int(self._clock.seconds() // BUCKET_SECONDS)
        bucket = ring[tick % BUCKETS]
        if bucket.tick != tick:
            bucket.tick, bucket.turns, bucket.home = tick, 0, 0
        bucket.turns += 1
        if record.affinity != "moved":
            bucket.home += 1

    def affinity(self, route: str) -> RouteAffinity:
        """One route's turns in the window as of now; a route not counted had none."""
        now = int(self._clock.seconds() // BUCKET_SECONDS)
        live = [b for b in self._turns.get(route, ()) if now - BUCKETS < b.tick <= now]
        return RouteAffinity(sum(b.turns for b in live), sum(b.home for b in live))


def _median(counts: list[int]) -> float | None:
    """The nearest-rank median of a histogram over :data:`GRID`: the lower of two middles."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = (total + 1) // 2, 0
    for value, count in zip(GRID, counts, strict=True):
        seen += count
        if seen >= rank:
            return value
    raise AssertionError("unreachable: the counts sum to total")

"""Each host's last five minutes: requests, errors, the median time to first byte, the
tokens its answers reported (prompt, of those cached, generated), its generation speed and
the median time to first token; and each ``cache_affinity`` route's: how many turns went to
their conversation's home.

The lifetime counters are in the metrics; an admin glancing at the status page wants
*now*. So each host has a ring of 30 buckets of 10 s, fed by every proxied request
(:class:`RecentTraffic` is a :class:`~crossbar.stats.record.ProxyObserver`). Memory is fixed
per host whatever the traffic: the ring never grows, and the times to first byte are
and to first token are each counted in a histogram whose bins are the values of two
significant digits (10 us to 9900 s), so the medians read from them are exact at the two
digits the page shows (the first token's in an ``array`` of 4-byte counts: 30 x 3.2 kB).
Recording costs a dict lookup, up to two bisects and nine increments; the medians are
found only when a page asks. Pure: no I/O, the time comes from a clock.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect
from collections.abc import Iterable, Sequence
from itertools import pairwise

import attrs

from crossbar.polling.health import Clock
from crossbar.stats.record import RequestRecord

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
    prompt_tokens: int = 0
    """Prompt tokens (cached ones included) of the answers that reported them."""
    cached_tokens: int = 0
    """Of those, the ones read from the host's prompt cache."""
    generated_tokens: int = 0
    tokens_per_second: float | None = None
    """Generated tokens over the seconds spent generating them, across the answers that
    reported a speed: a long answer weighs more than a short one. ``None``: no such answer."""
    first_token_p50: float | None = None
    """Median seconds from a request's arrival to its answer's first content event (two
    significant digits): the wait a user feels, prefill included."""

    @property
    def cache_hit_rate(self) -> float | None:
        """The share of prompt tokens read from the prompt cache; ``None`` without any."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


_ZEROS = array("I", [0]) * len(GRID)


class _Bucket:
    __slots__ = (
        "cached",
        "errors",
        "first_token",
        "generated",
        "prompt",
        "requests",
        "speed_seconds",
        "speed_tokens",
        "tick",
        "ttfb",
    )

    def __init__(self) -> None:
        self.tick = _NEVER
        self.requests = self.errors = 0
        self.prompt = self.cached = self.generated = self.speed_tokens = 0
        self.speed_seconds = 0.0
        self.ttfb: list[int] = []
        self.first_token = array("I")

    def reset(self, tick: int) -> None:
        self.tick = tick
        self.requests = self.errors = 0
        self.prompt = self.cached = self.generated = self.speed_tokens = 0
        self.speed_seconds = 0.0
        self.ttfb = [0] * len(GRID)
        self.first_token = _ZEROS[:]

    def count_usage(self, record: RequestRecord) -> None:
        """What the answer reported: cached tokens only beside their prompt's count, so
        that the hit rate stays a share; a speed only beside the tokens it was made at."""
        prompt, generated, speed = (
            record.prompt_tokens,
            record.generated_tokens,
            record.tokens_per_second,
        )
        if prompt is not None:
            self.prompt += prompt
            self.cached += record.cached_tokens or 0
        if generated is not None:
            self.generated += generated
            if speed is not None and generated > 0 and 0 < speed < math.inf:
                self.speed_tokens += generated
                self.speed_seconds += generated / speed
        if record.first_token is not None:
            self.first_token[bisect(_EDGES, record.first_token)] += 1


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
        bucket.count_usage(record)

    def host(self, name: str) -> HostRecent:
        """One host's window as of now; an unknown host did nothing."""
        ring = self._rings.get(name)
        if ring is None:
            return HostRecent()
        now = int(self._clock.seconds() // BUCKET_SECONDS)
        live = [b for b in ring if now - BUCKETS < b.tick <= now]
        if not live:
            return HostRecent()
        speed_seconds = sum(b.speed_seconds for b in live)
        return HostRecent(
            requests=sum(b.requests for b in live),
            errors=sum(b.errors for b in live),
            ttfb_p50=histogram_median(_summed(b.ttfb for b in live)),
            prompt_tokens=sum(b.prompt for b in live),
            cached_tokens=sum(b.cached for b in live),
            generated_tokens=sum(b.generated for b in live),
            tokens_per_second=(
                sum(b.speed_tokens for b in live) / speed_seconds if speed_seconds else None
            ),
            first_token_p50=histogram_median(_summed(b.first_token for b in live)),
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


def _summed(histograms: Iterable[Iterable[int]]) -> list[int]:
    return [sum(column) for column in zip(*histograms, strict=True)]


def histogram_median(counts: Sequence[int], grid: Sequence[float] = GRID) -> float | None:
    """The nearest-rank median of a histogram over ``grid``: the lower of two middles."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = (total + 1) // 2, 0
    for value, count in zip(grid, counts, strict=True):
        seen += count
        if seen >= rank:
            return value
    raise AssertionError("unreachable: the counts sum to total")

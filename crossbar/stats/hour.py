"""Each host's last hour, a minute at a time: what the status page's charts draw.

The recent window (:mod:`crossbar.stats.window`) says how a host does *now*, one figure
each; the charts say *since when*: requests and errors, prompt tokens and of them cached,
generated tokens, and the median time to first token, for each of the last 60 minutes.

Each host has a ring of 60 one-minute buckets, fed by every ended request
(:class:`HourlyTraffic` is a :class:`~crossbar.stats.record.ProxyObserver`). Memory is fixed per
host whatever the traffic: 60 buckets of six counters and a histogram of 61 four-byte
counts, about 25 kB; a host a reload removes is forgotten with its ring. The histogram's
bins are ten a decade (1 ms to 1000 s), so a minute's median is within 12 % of the true
one, finer than a small chart draws. Recording costs a dict lookup, a division, up to six
increments and, for an answer with a first token, one bisect over 60 edges; the series are
built only when a page asks. Pure: no I/O, the time comes from a clock.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect
from collections.abc import Iterable, Iterator
from itertools import pairwise

import attrs

from crossbar.polling.health import Clock
from crossbar.stats.record import RequestRecord
from crossbar.stats.window import histogram_median

MINUTES = 60
MINUTE_SECONDS = 60

FIRST_TOKEN_GRID: tuple[float, ...] = tuple(
    float(f"{10 ** (step / 10):.2g}") for step in range(-30, 31)
)
"""The values a minute's time to first token is rounded to: ten a decade, 1 ms to 1000 s."""
_EDGES = tuple(math.sqrt(low * high) for low, high in pairwise(FIRST_TOKEN_GRID))
_ZEROS = array("I", [0]) * len(FIRST_TOKEN_GRID)
_NEVER = -(1 << 62)
_EMPTY = (0,) * MINUTES


@attrs.frozen
class HostHour:
    """One host's last hour, one value a minute, oldest first; the last is the minute
    under way. Minutes of the hour before the host was known (or crossbar started) are 0."""

    requests: tuple[int, ...] = _EMPTY
    errors: tuple[int, ...] = _EMPTY
    """Answers of status 500 or more, as in the recent window."""
    prompt_tokens: tuple[int, ...] = _EMPTY
    """Every prompt token the answers reported, cached ones included."""
    cached_tokens: tuple[int, ...] = _EMPTY
    generated_tokens: tuple[int, ...] = _EMPTY
    first_token_p50: tuple[float | None, ...] = (None,) * MINUTES
    """Each minute's median seconds to first token; ``None``: no answer had one."""


class _Minute:
    __slots__ = ("cached", "errors", "first_token", "generated", "prompt", "requests", "tick")

    def __init__(self) -> None:
        self.tick = _NEVER
        self.requests = self.errors = self.prompt = self.cached = self.generated = 0
        self.first_token = array("I")

    def reset(self, tick: int) -> None:
        self.tick = tick
        self.requests = self.errors = self.prompt = self.cached = self.generated = 0
        self.first_token = _ZEROS[:]


class HourlyTraffic:
    """Rolling per-host counts over the last :data:`MINUTES` minutes, to the minute."""

    def __init__(self, hosts: Iterable[str], clock: Clock) -> None:
        self._clock = clock
        # Fixed until a reload: a record naming any other host (or none) adds nothing.
        self._rings = {name: _ring() for name in hosts}

    def set_hosts(self, hosts: Iterable[str]) -> None:
        """A reloaded config's hosts: those that stay keep their hour, new ones start
        empty, the others are forgotten (and their memory with them)."""
        self._rings = {name: self._rings.get(name) or _ring() for name in hosts}

    def request_done(self, record: RequestRecord) -> None:
        """Count one ended request; on every request's path, so nothing here sorts."""
        ring = self._rings.get(record.host) if record.host is not None else None
        if ring is None:
            return
        tick = int(self._clock.seconds() // MINUTE_SECONDS)
        minute = ring[tick % MINUTES]
        if minute.tick != tick:
            minute.reset(tick)
        minute.requests += 1
        if record.status >= 500:
            minute.errors += 1
        if record.prompt_tokens is not None:  # cached ones only beside their prompt's count
            minute.prompt += record.prompt_tokens
            minute.cached += record.cached_tokens or 0
        if record.generated_tokens is not None:
            minute.generated += record.generated_tokens
        if record.first_token is not None:
            minute.first_token[bisect(_EDGES, record.first_token)] += 1

    def host(self, name: str) -> HostHour:
        """One host's hour as of now; an unknown host did nothing."""
        ring = self._rings.get(name)
        if ring is None:
            return HostHour()
        minutes = list(self._minutes(ring))
        return HostHour(
            requests=tuple(0 if m is None else m.requests for m in minutes),
            errors=tuple(0 if m is None else m.errors for m in minutes),
            prompt_tokens=tuple(0 if m is None else m.prompt for m in minutes),
            cached_tokens=tuple(0 if m is None else m.cached for m in minutes),
            generated_tokens=tuple(0 if m is None else m.generated for m in minutes),
            first_token_p50=tuple(
                None if m is None else histogram_median(m.first_token, FIRST_TOKEN_GRID)
                for m in minutes
            ),
        )

    def hosts(self) -> dict[str, HostHour]:
        """Every host's hour as of now, in the order the hosts were given."""
        return {name: self.host(name) for name in self._rings}

    def _minutes(self, ring: list[_Minute]) -> Iterator[_Minute | None]:
        """The ring's minutes, oldest first; ``None`` for one not written this hour."""
        now = int(self._clock.seconds() // MINUTE_SECONDS)
        for tick in range(now - MINUTES + 1, now + 1):
            minute = ring[tick % MINUTES]
            yield minute if minute.tick == tick else None


def _ring() -> list[_Minute]:
    return [_Minute() for _ in range(MINUTES)]

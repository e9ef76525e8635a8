"""Per host, the conversations whose last turn went there: how many are live (a ring of
time buckets) and which ones, newest first, so that a ranking or a recount reads one
group's hosts' conversations, never the whole table. Pure rules, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

KEY_BYTES = 16
"""Bytes of a conversation's key (a BLAKE2b digest of what the request carries)."""
LIVE_SECONDS = 300
"""A conversation whose last turn is older than this no longer counts against its
host's slots: an agent that has been quiet for 5 minutes has most likely finished, and
its slot has gone to another prompt."""
BUCKET_SECONDS = 10
BUCKETS = LIVE_SECONDS // BUCKET_SECONDS
NEVER = -(1 << 62)


class Turn(Protocol):
    """What the table keeps of a conversation's last turn."""

    host: str
    tick: int


class LiveCounts:
    """One host's live conversations, counted by the time bucket of their last turn: a
    ring of :data:`LIVE_SECONDS` that never grows, and its running total, which drops
    a bucket once when it leaves the window (read on every choice, so never summed)."""

    __slots__ = ("counts", "now", "ticks", "total")

    def __init__(self) -> None:
        self.ticks = [NEVER] * BUCKETS
        self.counts = [0] * BUCKETS
        self.total = 0
        self.now = NEVER

    def at(self, now: int) -> int:
        """The live conversations as of tick ``now``."""
        if now > self.now:
            self.now = now
            for i, tick in enumerate(self.ticks):
                if self.counts[i] and tick <= now - BUCKETS:
                    self.total -= self.counts[i]
                    self.counts[i] = 0
        return self.total

    def add(self, now: int) -> None:
        """One more conversation's last turn at tick ``now`` (the latest)."""
        self.at(now)
        self.add_at(now)

    def add_at(self, tick: int) -> None:
        """One more conversation whose last turn was at ``tick`` (any order)."""
        i = tick % BUCKETS
        if tick <= self.now - BUCKETS or self.ticks[i] > tick:
            return  # out of the window already
        if self.ticks[i] != tick:
            self.total -= self.counts[i]  # an older tick's count, not yet dropped by at()
            self.ticks[i], self.counts[i] = tick, 0
        self.counts[i] += 1
        self.total += 1

    def remove(self, tick: int) -> None:
        """A conversation whose last turn was at ``tick`` is no longer counted here."""
        i = tick % BUCKETS
        if self.ticks[i] == tick and self.counts[i]:
            self.counts[i] -= 1
            self.total -= 1


class HostOrder:
    """Each host's conversations in the order of their last turns there: a list of keys
    per host, appended to at each turn. A key whose conversation has since moved, turned
    again or been dropped stays behind, passed over when read, until the list is twice
    what the host holds and is written again (a list costs 8 bytes a key, a dict 40)."""

    def __init__(self) -> None:
        self._keys: dict[str, list[bytes]] = {}
        self._held: dict[str, int] = {}

    def add(self, host: str, key: bytes, entries: Mapping[bytes, Turn]) -> None:
        """``key``'s last turn went to ``host`` (it is in ``entries`` already)."""
        keys = self._keys.setdefault(host, [])
        keys.append(key)
        held = self._held[host] = self._held.get(host, 0) + 1
        if len(keys) > 2 * held + 64:
            self._keys[host] = list(reversed([k for k, _ in self.newest(host, entries)]))

    def remove(self, host: str) -> None:
        """One of ``host``'s conversations has moved or been dropped."""
        held = self._held[host] = self._held[host] - 1
        if not held:
            del self._held[host], self._keys[host]  # a host that left leaves no trace

    def newest(
        self, host: str, entries: Mapping[bytes, Turn], oldest: int = NEVER
    ) -> Iterator[tuple[bytes, Turn]]:
        """``host``'s conversations, the latest turn first, down to (not including) those
        last seen at tick ``oldest``."""
        seen: set[bytes] = set()
        for key in reversed(self._keys.get(host, ())):
            entry = entries.get(key)
            if entry is None or entry.host != host or key in seen:
                continue  # dropped, moved, or a turn before its last one here
            if entry.tick <= oldest:
                return  # in the order of last turns: the rest are older
            seen.add(key)
            yield key, entry

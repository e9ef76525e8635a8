"""Where a conversation lives under ``cache_affinity``: its home by rendezvous hashing,
the bounded-load rule that may move it, and the bounded table of conversations seen.

**Home.** Each host of the group gets a weight, the BLAKE2b digest of the conversation's
key and the host's name; the heaviest is the conversation's home ("rendezvous" or
highest-random-weight hashing). Every crossbar replica with the same config computes the
same home from the request alone, without sharing anything, and a host that leaves the
group takes away only the conversations whose home it was: each of them moves to its
next heaviest host, and the others stay where their cache is.

**Bounded load** ("consistent hashing with bounded loads"). A host whose requests in
flight exceed ``max_load`` times the group's average (the new request counted) and that
has at least 2 more than the least busy host is passed over: the conversation goes to
its next host by weight that is within the bound (the least busy host always is).

**Slots.** A host whose ``slots`` (its ``-np``) are known holds at most that many
conversations' prompts. A conversation is *live* on a host when its last turn there
was within :data:`LIVE_SECONDS`. A conversation not live anywhere yet, whose host has as
many live conversations as slots, goes to its next host by weight that has room, when
one of the group has (else where it would have gone: no host is better).

**The table.** Each conversation seen (at most :data:`MAX_CONVERSATIONS`; the least
recently seen is dropped first) maps to the host its last turn went to. A conversation
that was moved is found there, and its later turns follow it to where its cache now is;
when that host is not in the group any more, the hash decides again. An entry has a
fixed size (a 16-byte key, a reference to a host name of the config, a time bucket), so
the cap on entries caps its bytes too. It is this crossbar's own: another replica knows
only the conversations it moved itself.

Pure rules, no I/O: the time comes from the caller.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Literal

import attrs

AffinityOutcome = Literal["new", "home", "moved"]
"""``new``: a conversation this crossbar had not seen, sent to its home; ``home``: a known
one sent to its home; ``moved``: sent elsewhere (the load bound, slots, a failed host), or
following an earlier move."""

MAX_CONVERSATIONS = 100_000
LIVE_SECONDS = 300
"""A conversation whose last turn is older than this no longer counts against its
host's slots: an agent that has been quiet for 5 minutes has most likely finished, and
its slot has gone to another prompt."""
BUCKET_SECONDS = 10
_BUCKETS = LIVE_SECONDS // BUCKET_SECONDS
_NEVER = -(1 << 62)


def weight(key: bytes, host: str) -> bytes:
    """The host's weight for the conversation: compared as bytes, the same everywhere."""
    return blake2b(key + host.encode(), digest_size=8).digest()


def rendezvous(key: bytes, hosts: Sequence[str]) -> list[str]:
    """``hosts`` in the conversation's order of preference: its home first."""
    return sorted(hosts, key=lambda host: (weight(key, host), host), reverse=True)


class Load:
    """The bounded-load rule over one group's requests in flight, read once per choice."""

    __slots__ = ("_in_flight", "_least", "_limit")

    def __init__(self, group: Sequence[str], in_flight: Mapping[str, int], max_load: float):
        counts = [in_flight.get(host, 0) for host in group]
        self._in_flight = in_flight
        self._limit = max_load * (sum(counts) + 1) / len(counts)
        self._least = min(counts)

    def fits(self, host: str) -> bool:
        """Whether a new request may go to ``host``."""
        busy = self._in_flight.get(host, 0)
        return busy <= self._limit or busy < self._least + 2


@attrs.frozen
class Placement:
    """Where one request of a conversation goes, and why."""

    host: str
    home: str
    """The conversation's home: the heaviest host of the group."""
    outcome: AffinityOutcome


class _Entry:
    __slots__ = ("host", "tick")

    def __init__(self, host: str, tick: int) -> None:
        self.host = host
        self.tick = tick


class _LiveCounts:
    """One host's live conversations, counted by the time bucket of their last turn: a
    ring of :data:`LIVE_SECONDS` that never grows, and its running total, which drops
    a bucket once when it leaves the window (read on every choice, so never summed)."""

    __slots__ = ("counts", "now", "ticks", "total")

    def __init__(self) -> None:
        self.ticks = [_NEVER] * _BUCKETS
        self.counts = [0] * _BUCKETS
        self.total = 0
        self.now = _NEVER

    def at(self, now: int) -> int:
        """The live conversations as of tick ``now``."""
        if now > self.now:
            self.now = now
            for i, tick in enumerate(self.ticks):
                if self.counts[i] and tick <= now - _BUCKETS:
                    self.total -= self.counts[i]
                    self.counts[i] = 0
        return self.total

    def add(self, now: int) -> None:
        """One more conversation's last turn at tick ``now`` (the latest)."""
        self.at(now)
        self.add_at(now)

    def add_at(self, tick: int) -> None:
        """One more conversation whose last turn was at ``tick`` (any order)."""
        i = tick % _BUCKETS
        if tick <= self.now - _BUCKETS or self.ticks[i] > tick:
            return  # out of the window already
        if self.ticks[i] != tick:
            self.total -= self.counts[i]  # an older tick's count, not yet dropped by at()
            self.ticks[i], self.counts[i] = tick, 0
        self.counts[i] += 1
        self.total += 1

    def remove(self, tick: int) -> None:
        """A conversation whose last turn was at ``tick`` is no longer counted here."""
        i = tick % _BUCKETS
        if self.ticks[i] == tick and self.counts[i]:
            self.counts[i] -= 1
            self.total -= 1


class Conversations:
    """The conversations this crossbar has placed: where each went last, and how many
    are live on each host that has ``slots``."""

    def __init__(
        self, slots: Mapping[str, int] | None = None, capacity: int = MAX_CONVERSATIONS
    ) -> None:
        self.slots = dict(slots or {})
        self.capacity = capacity
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._live = {host: _LiveCounts() for host in self.slots}
        self._tick = _NEVER
        """The last tick seen, one int object shared by the entries of its 10 s."""

    def __len__(self) -> int:
        return len(self._entries)

    def set_slots(self, slots: Mapping[str, int]) -> None:
        """A reloaded config's ``slots``: the live conversations of each host that has
        them are counted again from the table, so a host given slots starts right."""
        self.slots = dict(slots)
        self._live = {host: _LiveCounts() for host in self.slots}
        for entry in self._entries.values():
            counts = self._live.get(entry.host)
            if counts is not None:
                counts.add_at(entry.tick)

    def host_of(self, key: bytes) -> str | None:
        """Where the conversation's last turn went, if this crossbar placed it."""
        entry = self._entries.get(key)
        return None if entry is None else entry.host

    def live(self, host: str, now: float) -> int:
        """Conversations whose last turn went to ``host`` within :data:`LIVE_SECONDS`
        (counted for hosts with ``slots`` only)."""
        counts = self._live.get(host)
        return 0 if counts is None else counts.at(self._now(now))

    def has_room(self, host: str, now: float) -> bool:
        """Whether ``host`` holds fewer live conversations than its slots (no ``slots``:
        always)."""
        slots = self.slots.get(host)
        return slots is None or self.live(host, now) < slots

    def is_live(self, key: bytes, now: float) -> bool:
        entry = self._entries.get(key)
        return entry is not None and self._now(now) - _BUCKETS < entry.tick

    def place(
        self,
        key: bytes,
        group: Sequence[str],
        in_flight: Mapping[str, int],
        max_load: float,
        now: float,
        exclude: Sequence[str] = (),
    ) -> Placement | None:
        """Choose among ``group`` (the best group of healthy hosts, in route order) for
        one request of conversation ``key``, and remember it. Hosts in ``exclude`` (tried
        already) are passed over, but the home is still the group's: a retry elsewhere is
        a move. ``None`` when no host of the group is left."""
        order = rendezvous(key, group)
        hosts = [host for host in order if host not in exclude]
        if not hosts:
            return None
        home = order[0]
        last = self.host_of(key)
        if last is not None and last in hosts and last != home:
            hosts.remove(last)
            hosts.insert(0, last)  # its cache is there now
        load = Load(hosts, in_flight, max_load)
        host = hosts[0]
        if not load.fits(host) or not self._room_for(key, host, hosts, now):
            roomy = [h for h in hosts if self.has_room(h, now)] if self.slots else hosts
            host = next((h for h in roomy if load.fits(h)), None) or next(
                h for h in hosts if load.fits(h)
            )
        outcome: AffinityOutcome = "moved" if host != home else "home" if last else "new"
        self.remember(key, host, now)
        return Placement(host, home, outcome)

    def _room_for(self, key: bytes, host: str, hosts: Sequence[str], now: float) -> bool:
        """Whether the conversation may stay on ``host`` as far as slots go: it is live
        there already, the host has room, or no host of the group has."""
        if not self.slots or self.has_room(host, now):
            return True
        if self.is_live(key, now) and self.host_of(key) == host:
            return True
        return not any(self.has_room(h, now) for h in hosts)

    def remember(self, key: bytes, host: str, now: float) -> None:
        """The conversation's latest turn went to ``host`` at ``now``."""
        tick = self._now(now)
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            if len(entries) >= self.capacity:
                _, oldest = entries.popitem(last=False)
                self._uncount(oldest)
            entry = entries[key] = _Entry(host, tick)
        else:
            entries.move_to_end(key)
            self._uncount(entry)
            entry.host, entry.tick = host, tick
        counts = self._live.get(host)
        if counts is not None:
            counts.add(tick)

    def _uncount(self, entry: _Entry) -> None:
        counts = self._live.get(entry.host)
        if counts is not None:
            counts.remove(entry.tick)

    def _now(self, now: float) -> int:
        tick = int(now // BUCKET_SECONDS)
        if tick != self._tick:
            self._tick = tick
        return self._tick

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
its next host by weight that is within the bound (the least busy host always is). A host
with fewer requests in flight than its ``slots`` is never passed over: it starts the
request at once, and moving would prefill the whole conversation again elsewhere.

**Slots.** A host whose ``slots`` (its ``-np``) are known holds at most that many
conversations' prompts. A conversation is *live* on a host when its last turn there
was within :data:`LIVE_SECONDS`. A conversation not live anywhere yet, whose host has as
many live conversations as slots, goes to its next host by weight that has room, when
one of the group has (else where it would have gone: no host is better).

**The table.** Each conversation seen (at most :data:`MAX_CONVERSATIONS`; the least
recently seen is dropped first) maps to the host its last turn went to. A conversation
that was moved is found there, and its later turns follow it to where its cache now is;
when that host is not in the group any more, the hash decides again. An entry has a
fixed size (a 16-byte key, a reference to a host name of the config, a time bucket, a
turn), so the cap on entries caps its bytes too. It is this crossbar's own.

**Replicas.** A replica (or a worker) sees only some turns of a conversation. Workers,
and replicas with ``shared_state``, tell each other where they placed each turn
(:mod:`~crossbar.routing.sharedplacements`), and all keep one table. Without, a
conversation another replica answers too (it is first
seen after its first turn, or its turn jumps) is *ranked*: all live conversations of the
group, in the order of a second hash, each take the first host by weight that has a slot
left, which replicas that have seen the same ones agree on (docs/design/affinity.md).

Pure rules, no I/O: the time comes from the caller.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from crossbar.routing.conversationtable import (
    BUCKET_SECONDS,
    BUCKETS,
    NEVER,
    HostOrder,
    LiveCounts,
)
from crossbar.routing.rendezvous import ranked_hosts, rendezvous, take_slot
from crossbar.routing.sharedplacements import OutgoingPlacements, Placed, replaces

AffinityOutcome = Literal["new", "home", "moved"]
"""``new``: a conversation this crossbar had not seen, sent to its home; ``home``: a known
one sent to its home; ``moved``: sent elsewhere (the load bound, slots, a failed host), or
following an earlier move."""

MAX_CONVERSATIONS = 100_000
RANK_SECONDS = 1.0
RANK_EXACT = 256
"""The ranking of up to this many live conversations (under a millisecond) is computed
again whenever one comes or goes; of more, at most once every :data:`RANK_SECONDS`."""
RANK_MOST = 4096
"""Beyond this many live conversations nothing is ranked (a ranking would take over
10 ms a second): far more than a lab's agents, so reached only by a flood of made-up
conversations, which then cannot make crossbar stall."""


class LoadBound:
    """The bounded-load rule over one group's requests in flight, read once per choice."""

    __slots__ = ("_in_flight", "_least", "_limit", "_slots")

    def __init__(
        self,
        group: Sequence[str],
        in_flight: Mapping[str, int],
        max_load: float,
        slots: Mapping[str, int] | None = None,
    ):
        counts = [in_flight.get(host, 0) for host in group]
        self._in_flight = in_flight
        self._limit = max_load * (sum(counts) + 1) / len(counts)
        self._least = min(counts)
        self._slots = slots or {}

    def fits(self, host: str) -> bool:
        """Whether a new request may go to ``host``."""
        busy = self._in_flight.get(host, 0)
        return busy <= self._limit or busy < self._least + 2 or busy < self._slots.get(host, 0)


@attrs.frozen
class Placement:
    """Where one request of a conversation goes, and why."""

    host: str
    home: str
    """The conversation's home: the heaviest host of the group."""
    outcome: AffinityOutcome


class _Entry:
    __slots__ = ("host", "ranked", "tick", "turn")

    def __init__(self, host: str, tick: int, turn: int) -> None:
        self.host = host
        self.tick = tick
        self.turn = turn
        """The highest turn seen (-1: none, a completion)."""
        self.ranked = False


class _Ranking:
    """The last :func:`ranked_hosts` of one group, and what it was computed from."""

    __slots__ = ("at", "crowded", "group", "placed", "taken", "tick", "version")

    def __init__(
        self,
        group: tuple[str, ...],
        version: int,
        tick: int,
        at: float,
        placed: dict[bytes, str],
        crowded: bool = False,
    ) -> None:
        self.group, self.version, self.tick, self.at = group, version, tick, at
        self.placed = placed
        self.crowded = crowded
        """More than :data:`RANK_MOST` were live: nothing was ranked."""
        self.taken = dict.fromkeys(group, 0)
        for host in placed.values():
            self.taken[host] += 1


class Conversations:
    """The conversations this crossbar has placed: where each went last, and how many
    are live on each host that has ``slots``."""

    def __init__(
        self, slots: Mapping[str, int] | None = None, capacity: int = MAX_CONVERSATIONS
    ) -> None:
        self.slots = dict(slots or {})
        self.capacity = capacity
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._order = HostOrder()
        """The same conversations by the host of their last turn: a ranking or a
        recount reads its hosts' live ones, never the whole table."""
        self._live = {host: LiveCounts() for host in self.slots}
        self._tick = NEVER
        """The last tick seen, one int object shared by the entries of its 10 s."""
        self._version = 0
        """Counts conversations added and dropped: the ranking is computed again after."""
        self._rankings: dict[tuple[str, ...], _Ranking] = {}
        """The last ranking of each group (a route's hosts, as health leaves them)."""
        self._replicas_seen = NEVER
        """The tick another replica was last seen answering turns of a conversation."""
        self.outgoing: OutgoingPlacements | None = None
        """While this process shares its placements with others (workers, or replicas
        with ``shared_state``), what it placed since it last sent them; nothing is ranked
        then."""

    def __len__(self) -> int:
        return len(self._entries)

    def set_slots(self, slots: Mapping[str, int]) -> None:
        """A reloaded config's ``slots``. A host given slots has its live conversations
        counted from its own entries, so it starts right; a host that keeps slots keeps
        its count; unchanged slots cost nothing (a reload must not read the table)."""
        slots = dict(slots)
        if slots == self.slots:
            return
        self._live = {host: self._live.get(host) or self._count(host) for host in slots}
        self.slots = slots
        self._rankings.clear()  # made with the old slots

    def _count(self, host: str) -> LiveCounts:
        counts = LiveCounts()
        for _, entry in self._order.newest(host, self._entries, self._tick - BUCKETS):
            counts.add_at(entry.tick)
        return counts

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
        return entry is not None and self._now(now) - BUCKETS < entry.tick

    def place(
        self,
        key: bytes,
        group: Sequence[str],
        in_flight: Mapping[str, int],
        max_load: float,
        now: float,
        exclude: Sequence[str] = (),
        turn: int | None = None,
    ) -> Placement | None:
        """Choose among ``group`` (the best group of healthy hosts, in route order) for
        one request of conversation ``key`` at ``turn``, and remember it. Hosts in
        ``exclude`` (tried already) are passed over, but the home is still the group's: a
        retry elsewhere is a move. ``None`` when no host of the group is left."""
        order = rendezvous(key, group)
        hosts = [host for host in order if host not in exclude]
        if not hosts:
            return None
        home = order[0]
        entry = self._entries.get(key)
        tick = self._now(now)
        ranked = self._answered_elsewhere(entry, turn, tick)
        first = self._ranked_host(key, group, now, tick) if ranked else None
        if first is None:
            ranked = False  # not ranked this time: too many live conversations
            first = entry.host if entry else None
        if first is not None and first in hosts and first != hosts[0]:
            hosts.remove(first)
            hosts.insert(0, first)  # its cache is there (or, ranked, will be)
        load = LoadBound(hosts, in_flight, max_load, self.slots)
        host = hosts[0]
        if not load.fits(host) or not (ranked or self._room_for(key, host, hosts, now)):
            roomy = [h for h in hosts if self.has_room(h, now)] if self.slots else hosts
            host = next((h for h in roomy if load.fits(h)), None) or next(
                h for h in hosts if load.fits(h)
            )
        outcome: AffinityOutcome = "moved" if host != home else "home" if entry else "new"
        self.remember(key, host, now, turn, ranked)
        return Placement(host, home, outcome)

    def _answered_elsewhere(self, entry: _Entry | None, turn: int | None, tick: int) -> bool:
        """Whether the conversation is ranked (only with ``slots``, the one rule replicas
        could disagree on): another replica answers turns of it too, or it is new while
        other replicas have been seen within :data:`LIVE_SECONDS` (so that its first
        turn goes where the replica that gets its second will rank it). Seeing another
        replica's turn is noted here, as the time it was last seen."""
        if turn is None or not self.slots or self.outgoing is not None:
            return False
        if entry is not None and entry.ranked:
            return True
        if turn > (0 if entry is None else entry.turn + 1):
            self._replicas_seen = tick
            return True
        return entry is None and tick - self._replicas_seen < BUCKETS

    def _ranked_host(self, key: bytes, group: Sequence[str], now: float, tick: int) -> str | None:
        """Where :func:`ranked_hosts` puts ``key`` among the conversations live on the
        group's hosts, computed again when conversations have come or gone. It reads every
        live one: beyond :data:`RANK_EXACT` of them, at most once every
        :data:`RANK_SECONDS`, and a conversation new since then takes the first host with a
        slot left, as if ranked last. ``None`` when more than :data:`RANK_MOST` are live:
        the conversation is then placed as if this crossbar were alone."""
        hosts = tuple(group)
        ranking = self._rankings.get(hosts)
        if ranking is None or self._due(ranking, key, tick, now):
            live = self._live_on(hosts, key, tick)
            if len(self._rankings) >= 16:  # groups seen as health changed: start afresh
                self._rankings.clear()
            crowded = len(live) > RANK_MOST
            placed = {} if crowded else ranked_hosts(live, group, self.slots)
            ranking = _Ranking(hosts, self._version, tick, now, placed, crowded)
            self._rankings[hosts] = ranking
        if ranking.crowded:
            return None
        host = ranking.placed.get(key)
        if host is None:
            host = ranking.placed[key] = take_slot(key, group, self.slots, ranking.taken)
        return host

    def _live_on(self, hosts: Sequence[str], key: bytes, tick: int) -> list[bytes]:
        """``key`` and the conversations live on ``hosts``, up to one more than
        :data:`RANK_MOST`: only those hosts' entries are read, never other groups'."""
        live = [key]
        for host in hosts:
            for other, _ in self._order.newest(host, self._entries, tick - BUCKETS):
                if other != key:
                    live.append(other)
                    if len(live) > RANK_MOST:
                        return live
        return live

    def _due(self, ranking: _Ranking, key: bytes, tick: int, now: float) -> bool:
        """Whether ``ranking`` is to be computed again: conversations came or went since
        (or ``key`` is not in it), and it is small or a second old."""
        changed = (ranking.version, ranking.tick) != (self._version, tick)
        if not changed and key in ranking.placed:
            return False
        small = not ranking.crowded and len(ranking.placed) <= RANK_EXACT
        return small or now >= ranking.at + RANK_SECONDS

    def _room_for(self, key: bytes, host: str, hosts: Sequence[str], now: float) -> bool:
        """Whether the conversation may stay on ``host`` as far as slots go: it is live
        there already, the host has room, or no host of the group has."""
        if not self.slots or self.has_room(host, now):
            return True
        if self.is_live(key, now) and self.host_of(key) == host:
            return True
        return not any(self.has_room(h, now) for h in hosts)

    def remember(
        self, key: bytes, host: str, now: float, turn: int | None = None, ranked: bool = False
    ) -> None:
        """The conversation's latest turn (``turn``, if known) went to ``host`` at ``now``;
        ``ranked``: it is ranked from now on."""
        outgoing = self.outgoing
        if outgoing is not None:
            entry = self._entries.get(key)
            outgoing.add(key, host, turn, entry is None or entry.host != host)
        self._put(key, host, self._now(now), turn, ranked)

    def heard(self, placed: Sequence[Placed], now: float) -> None:
        """Placements another crossbar made, each taken where it is newer than this one's
        entry (:func:`~crossbar.routing.sharedplacements.replaces`); the oldest first."""
        latest = self._now(now)
        for one in sorted(placed, key=lambda p: -p.age):
            tick = min(latest, int((now - max(0.0, one.age)) // BUCKET_SECONDS))
            if tick <= latest - BUCKETS:
                continue  # no longer live: nothing to learn
            entry = self._entries.get(one.key)
            if entry is None or replaces(one, entry.turn, entry.host):
                self._put(one.key, one.host, tick, one.turn if one.turn >= 0 else None)

    def _put(
        self, key: bytes, host: str, tick: int, turn: int | None, ranked: bool = False
    ) -> None:
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            if len(entries) >= self.capacity:
                _, oldest = entries.popitem(last=False)
                self._uncount(oldest)
                self._order.remove(oldest.host)
            entry = entries[key] = _Entry(host, tick, -1)
            self._version += 1
        else:
            entries.move_to_end(key)
            self._uncount(entry)
            self._order.remove(entry.host)
            entry.host, entry.tick = host, tick
        self._order.add(host, key, entries)
        if turn is not None and turn > entry.turn:
            entry.turn = turn
        entry.ranked = entry.ranked or ranked
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

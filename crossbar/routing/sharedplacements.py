"""Conversations' placements shared between crossbar processes (``shared_state``): the
ones this process made, waiting to be sent, and the ones another process made, as heard.

``cache_affinity`` remembers where each conversation's last turn went. Replicas that take
turns of the same conversations agree on their hosts when each tells the others where it
placed a turn: the other replica then finds the conversation in its own table at the next
turn, and sends it where its cache is. Pure rules, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from crossbar.routing.conversationtable import KEY_BYTES

MOST_TURN = 1 << 20
"""A turn beyond this (a million answers in one conversation) is not one."""
MOST_WAITING = 4096
"""Placements waiting to be sent at most (a store that is down lets them pile up): the
oldest is dropped first. A lab's live conversations are far fewer."""


@attrs.frozen
class Placed:
    """One conversation's last turn went to ``host``."""

    key: bytes
    host: str
    turn: int
    """The turn (the answers already in the conversation); -1 when the API tells none."""
    age: float = 0.0
    """Seconds since it was placed (heard: by the store's clock)."""


class OutgoingPlacements:
    """This process's placements not yet sent: the latest of each conversation, oldest
    first. ``ready`` is called when the first one comes in after a :meth:`take`."""

    def __init__(self, ready: Callable[[], None] | None = None, most: int = MOST_WAITING) -> None:
        self.ready = ready
        self.most = most
        self._waiting: dict[bytes, Placed] = {}
        self.fresh: set[bytes] = set()
        """The waiting conversations whose host the others do not know: new to this
        process, or moved (a turn there waits until they are told, :mod:`placesync`)."""

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, key: bytes, host: str, turn: int | None, fresh: bool = False) -> None:
        """The conversation ``key``'s turn ``turn`` (``None``: not told) went to ``host``;
        ``fresh``: a host other than its last one here (or its first)."""
        waiting = self._waiting
        first = not waiting
        waiting.pop(key, None)  # the latest goes last
        if len(waiting) >= self.most:
            self.fresh.discard(oldest := next(iter(waiting)))
            del waiting[oldest]
        waiting[key] = Placed(key, host, -1 if turn is None else turn)
        if fresh:
            self.fresh.add(key)
        if first and self.ready is not None:
            self.ready()

    def take(self, most: int) -> tuple[list[Placed], set[bytes]]:
        """Up to ``most`` placements, oldest first, no longer waiting; and which of them
        were fresh."""
        waiting = self._waiting
        taken = [waiting[key] for key in list(waiting)[:most]]
        fresh = set()
        for placed in taken:
            del waiting[placed.key]
            if placed.key in self.fresh:
                fresh.add(placed.key)
        self.fresh -= fresh
        return taken, fresh


def replaces(placed: Placed, turn: int, host: str) -> bool:
    """Whether a heard placement replaces a conversation's entry (at ``turn`` on ``host``):
    it is of a later turn, or of the same turn on another host (the request was placed
    again, after a failover or a wait at a busy home: heard later, so placed later)."""
    if placed.turn != turn:
        return placed.turn > turn
    return placed.host != host


def read_placed(key: object, host: object, turn: object, age: object) -> Placed | None:
    """A placement another process sent (the key in hex); ``None`` when any part is not
    one: the sender is not trusted."""
    if not (isinstance(key, str) and len(key) == 2 * KEY_BYTES):
        return None
    if not (isinstance(host, str) and 0 < len(host) <= 1024):
        return None
    if not (type(turn) is int and -1 <= turn <= MOST_TURN):
        return None
    if not (type(age) in (int, float) and math.isfinite(age)):  # type: ignore[arg-type]
        return None
    try:
        digest = bytes.fromhex(key)
    except ValueError:
        return None
    return Placed(digest, host, turn, max(0.0, float(age)))  # type: ignore[arg-type]

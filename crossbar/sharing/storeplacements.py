"""Conversations' placements in the shared store (``shared_state``): each call is one
atomic run of :data:`~crossbar.sharing.placescript.PLACES_SCRIPT`.

What comes back is checked as hostile, as the ledger's is: a malformed placement is left
out (and a host this crossbar's config does not know, by
:meth:`~crossbar.sharing.placesync.PlacementSync.heard`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from crossbar.routing import LIVE_SECONDS, Placed, read_placed
from crossbar.sharing.placescript import PLACES_SCRIPT
from crossbar.sharing.store import PREFIX, Commands

MOST_PLACEMENTS = 4096
"""Placements the store keeps at most (the latest), and sent or read in one call."""

MOST_MESSAGE = 1 << 20
"""Characters of a published put at most (4,096 placements fit in a quarter of it)."""

_KEYS = ("placements", "placement-order", "placement-ids")


@attrs.frozen
class Heard:
    """What one read of the store's placements brought: the placements, and where the
    next read goes on from."""

    seq: int = 0
    placed: tuple[Placed, ...] = ()


class StorePlacements:
    """The calls a replica makes on the store's placements, each answered by a Deferred."""

    def __init__(
        self,
        commands: Commands,
        prefix: str = PREFIX,
        most: int = MOST_PLACEMENTS,
        life: float = LIVE_SECONDS,
    ) -> None:
        self.commands, self.prefix, self.most = commands, prefix, most
        self.life_ms = round(life * 1000)
        self.keys = [prefix + key for key in _KEYS]

    def _run(self, op: str, *args: object) -> Deferred[Any]:
        args = (op, self.prefix, self.life_ms, self.most, *args)
        return self.commands.eval(PLACES_SCRIPT, self.keys, list(args))

    def put(self, name: str, placed: Sequence[Placed]) -> Deferred[Any]:
        """Member ``name`` placed these (at most :attr:`most` are sent)."""
        rows = [[p.key.hex(), p.host, p.turn] for p in placed[: self.most]]
        return self._run("put", name, json.dumps(rows, separators=(",", ":")))

    def since(self, seq: int, own: str | None = None) -> Deferred[Heard]:
        """The placements after sequence number ``seq``, but member ``own``'s."""
        return self._run("since", seq).addCallback(load_heard, own)


class PlacementReads:
    """Reads the store's placements from where the last read left off, one read at a
    time (one more after it, when asked meanwhile), each into ``heard``; member ``name``'s
    own left out."""

    def __init__(
        self,
        name: str,
        store: StorePlacements,
        heard: Callable[[Sequence[Placed]], None],
        failed: Callable[[Failure], None],
    ) -> None:
        self.name, self.store, self.heard, self.failed = name, store, heard, failed
        self._seq = 0
        self._reading, self._again = False, False
        self.stopped = False

    def read(self) -> None:
        if self.stopped:
            return
        if self._reading:
            self._again = True
            return
        self._reading = True
        read = self.store.since(self._seq, self.name)
        read.addCallbacks(self._read, self.failed).addBoth(self._done)

    def _read(self, heard: Heard) -> None:
        if not self.stopped:
            self._seq = heard.seq
            self.heard(heard.placed)

    def _done(self, _: object) -> None:
        self._reading = False
        if self._again:
            self._again = False
            self.read()


def placed_channel(prefix: str = PREFIX) -> str:
    """The channel each put is published on (its message: who put, and what)."""
    return prefix + "placed"


def load_published(message: str, own: str) -> list[Placed]:
    """The placements another member put, as the store published them (member ``own``'s
    left out); nothing when malformed."""
    value = _json(message, MOST_MESSAGE)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], list)):
        return []
    name, rows = value
    if name == own:
        return []
    rows = [row for row in rows[:MOST_PLACEMENTS] if isinstance(row, list) and len(row) == 3]
    placed = [read_placed(key, host, turn, 0.0) for key, host, turn in rows]
    return [one for one in placed if one is not None]


def load_heard(answer: object, own: str | None = None) -> Heard:
    """The script's answer to ``since``, each placement checked; nothing when malformed."""
    if not (isinstance(answer, list) and len(answer) == 3):
        return Heard()
    seq, now, flat = answer
    if not (_digits(seq) and _digits(now) and isinstance(flat, list)):
        return Heard()
    now_ms = int(now)
    placed = []
    for key, value in zip(flat[0::2], flat[1::2], strict=False):
        one = _placed(key, value, now_ms, own)
        if one is not None:
            placed.append(one)
    return Heard(int(seq), tuple(placed[:MOST_PLACEMENTS]))


def _placed(key: object, text: object, now_ms: int, own: str | None) -> Placed | None:
    value = _json(text)
    if not (isinstance(value, list) and len(value) == 4 and type(value[2]) is int):
        return None
    host, turn, ms, member = value
    if member == own:
        return None  # this replica's own, known here already
    return read_placed(key, host, turn, (now_ms - ms) / 1000)


def _json(text: object, most: int = 2048) -> object:
    if not (isinstance(text, str) and len(text) <= most):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _digits(value: object) -> bool:
    return isinstance(value, str) and value.isdigit() and len(value) < 20

"""Conversations' placements in the shared store (``shared_state``): each call is one
atomic run of :data:`~crossbar.sharing.placescript.PLACES_SCRIPT`.

What comes back is checked as hostile, as the ledger's is: a malformed placement is left
out, a host name is kept only if this crossbar's config knows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from twisted.internet.defer import Deferred

from crossbar.routing import LIVE_SECONDS, Placed
from crossbar.sharing.placescript import PLACES_SCRIPT
from crossbar.sharing.store import PREFIX, Commands

MOST_PLACEMENTS = 4096
"""Placements the store keeps at most (the latest), and sent or read in one call."""
KEY_TEXT = 32
"""Characters of a conversation's key as the store keeps it: 16 bytes in hex."""
MOST_TURN = 1 << 20

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

    def since(self, seq: int, knows: Callable[[str], bool]) -> Deferred[Heard]:
        """The placements after sequence number ``seq``, of hosts ``knows`` accepts."""
        return self._run("since", seq).addCallback(load_heard, knows)


def placed_channel(prefix: str = PREFIX) -> str:
    """The channel each put is published on (its message: who put)."""
    return prefix + "placed"


def load_heard(answer: object, knows: Callable[[str], bool]) -> Heard:
    """The script's answer to ``since``, each placement checked; nothing when malformed."""
    if not (isinstance(answer, list) and len(answer) == 3):
        return Heard()
    seq, now, flat = answer
    if not (_digits(seq) and _digits(now) and isinstance(flat, list)):
        return Heard()
    now_ms = int(now)
    placed = []
    for key, value in zip(flat[0::2], flat[1::2], strict=False):
        one = _placed(key, value, now_ms, knows)
        if one is not None:
            placed.append(one)
    return Heard(int(seq), tuple(placed[:MOST_PLACEMENTS]))


def _placed(key: object, text: object, now_ms: int, knows: Callable[[str], bool]) -> Placed | None:
    if not (isinstance(key, str) and len(key) == KEY_TEXT and isinstance(text, str)):
        return None
    if len(text) > 2048:
        return None
    try:
        value = json.loads(text)
        digest = bytes.fromhex(key)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(value, list) and len(value) == 3):
        return None
    host, turn, ms = value
    if not (isinstance(host, str) and knows(host)):
        return None
    if not (type(turn) is int and -1 <= turn <= MOST_TURN and type(ms) is int):
        return None
    return Placed(digest, host, turn, max(0, now_ms - ms) / 1000)


def _digits(value: object) -> bool:
    return isinstance(value, str) and value.isdigit() and len(value) < 20

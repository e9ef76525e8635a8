"""Which loaded models' slots to ask a host for, and what its answer says: no I/O.

In router mode each loaded model runs its own slots (its ``-np``). A router answers
``GET /props?model=X&autoload=false`` with X's own props (``total_slots``) when X is loaded
and ``400 model is not loaded`` otherwise, loading nothing; a single-model server ignores
the query and answers its props. So the poller asks only for models its last list showed
loaded, a few a poll, and an answer it cannot use means "unknown", never "down".
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

import msgspec

MAX_PROPS_BODY = 256 * 1024
"""Largest ``/props`` answer read: a model's props are a few KiB (its chat template most)."""
MAX_SLOTS = 4096
"""Largest ``total_slots`` believed; more (or fewer than one) is "unknown"."""
ASKS_PER_POLL = 4
"""At most this many ``/props`` asks a poll of one host: many loaded models take several polls."""
ASK_AGAIN_SECONDS = 60.0
"""A model asked about is asked again after this long, whatever it answered: a model
unloaded and loaded again between two polls may have come back with another ``-np``."""


class _Props(msgspec.Struct, gc=False):
    total_slots: int | None = None


_PROPS = msgspec.json.Decoder(_Props)


def props_path(model: str) -> str:
    """The path that asks a router for ``model``'s props without ever loading it."""
    return f"/props?model={quote(model, safe='')}&autoload=false"


def total_slots(body: bytes) -> int | None:
    """The ``total_slots`` of a ``/props`` answer, or ``None`` when it has no believable one
    (not JSON, not an integer, or outside 1..:data:`MAX_SLOTS`)."""
    try:
        slots = _PROPS.decode(body).total_slots
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return slots if slots is not None and 1 <= slots <= MAX_SLOTS else None


class SlotAsks:
    """When each of one host's loaded models was last asked about: the rule of whom to ask."""

    def __init__(self) -> None:
        self._asked: dict[str, float] = {}

    def due(self, loaded: Iterable[str], now: float) -> list[str]:
        """Loaded models to ask about now: those never asked since they were seen loaded
        first, then those asked :data:`ASK_AGAIN_SECONDS` ago or more, oldest first; at most
        :data:`ASKS_PER_POLL`. A model no longer loaded is forgotten, so that it is asked
        again as soon as it is loaded again."""
        loaded = list(dict.fromkeys(loaded))
        current = set(loaded)
        self._asked = {m: at for m, at in self._asked.items() if m in current}
        fresh = [m for m in loaded if m not in self._asked]
        stale = sorted(
            (m for m, at in self._asked.items() if now - at >= ASK_AGAIN_SECONDS),
            key=self._asked.__getitem__,
        )
        chosen = (fresh + stale)[:ASKS_PER_POLL]
        for model in chosen:
            self._asked[model] = now
        return chosen

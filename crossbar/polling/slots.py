"""Which loaded models' slots to ask a host for, and what its answer says: no I/O.

The same answer tells the window of a slot, ``default_generation_settings.n_ctx``: the
``-c`` divided among the ``-np`` slots (and capped at the model's training context), the
longest prompt one request may have there.

In router mode each loaded model runs its own slots (its ``-np``). A router answers
``GET /props?model=X&autoload=false`` with X's own props (``total_slots``) when X is loaded
and ``400 model is not loaded`` otherwise, loading nothing; a single-model server ignores
the query and answers its props. So the poller asks only for models its last list showed
loaded, a few a poll, and an answer it cannot use means "unknown", never "down".
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

import attrs
import msgspec

MAX_PROPS_BODY = 256 * 1024
"""Largest ``/props`` answer read: a model's props are a few KiB (its chat template most)."""
MAX_SLOTS = 4096
"""Largest ``total_slots`` believed; more (or fewer than one) is "unknown"."""
MAX_WINDOW = 1 << 24
"""Largest slot window believed (16,777,216 tokens: past any model's training context);
more (or fewer than one token) is "unknown"."""
ASKS_PER_POLL = 4
"""At most this many ``/props`` asks a poll of one host: many loaded models take several polls."""
ASK_AGAIN_SECONDS = 60.0
"""A model asked about is asked again after this long, whatever it answered: a model
unloaded and loaded again between two polls may have come back with another ``-np``."""


class _Settings(msgspec.Struct, gc=False):
    n_ctx: int | float | str | bool | list[msgspec.Raw] | dict[str, msgspec.Raw] | None = None


class _Props(msgspec.Struct, gc=False):
    total_slots: int | float | str | bool | list[msgspec.Raw] | dict[str, msgspec.Raw] | None = None
    default_generation_settings: _Settings | int | float | str | bool | list[msgspec.Raw] | None = (
        None
    )


_PROPS = msgspec.json.Decoder(_Props)


def props_path(model: str) -> str:
    """The path that asks a router for ``model``'s props without ever loading it."""
    return f"/props?model={quote(model, safe='')}&autoload=false"


@attrs.frozen
class ModelProps:
    """What one model's ``/props`` said: its slots and a slot's window (``None``: unknown)."""

    slots: int | None = None
    window: int | None = None


def _bounded(value: object, most: int) -> int | None:
    """``value`` when it is an integer (``true`` is not one) within 1..``most``."""
    if type(value) is not int or not 1 <= value <= most:
        return None
    return value


def read_props(body: bytes) -> ModelProps:
    """A ``/props`` answer's ``total_slots`` (1..:data:`MAX_SLOTS`) and slot window
    (``default_generation_settings.n_ctx``, 1..:data:`MAX_WINDOW`); each ``None`` when it has
    no believable one (not JSON, not an integer, out of range). A router's own props (no
    model) say ``n_ctx: 0``: unknown."""
    try:
        props = _PROPS.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ModelProps()
    settings = props.default_generation_settings
    window = settings.n_ctx if isinstance(settings, _Settings) else None
    return ModelProps(_bounded(props.total_slots, MAX_SLOTS), _bounded(window, MAX_WINDOW))


def total_slots(body: bytes) -> int | None:
    """The ``total_slots`` of a ``/props`` answer, or ``None`` when it has no believable one
    (not JSON, not an integer, or outside 1..:data:`MAX_SLOTS`)."""
    return read_props(body).slots


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

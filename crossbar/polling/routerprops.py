"""A router's room for models, from its own ``GET /props``: no I/O.

A llama-server router answers ``GET /props`` *without* ``?model=`` itself, loading nothing:
``{"role": "router", "max_instances": N, "models_autoload": true, ...}``, N its
``--models-max``. (With ``?model=X`` it would load X first.) A single-model server answers
its own props, with no ``role``: it has no room to tell, and none is taken. What a host said
is asked again now and then, and after the host failed: it may have restarted with other flags.
"""

from __future__ import annotations

import attrs
import msgspec

ROOM_PATH = "/props"
"""The router's own props: never with ``?model=``, which loads the model."""
MAX_INSTANCES = 1024
"""Largest ``max_instances`` believed; more (or fewer than one) is "unknown"."""
ASK_AGAIN_SECONDS = 60.0
"""A host's room is asked again after this long."""


class _Props(msgspec.Struct, gc=False):
    role: str | None = None
    max_instances: int | None = None
    models_autoload: bool | None = None


_PROPS = msgspec.json.Decoder(_Props)


@attrs.frozen
class Room:
    """What a host said of its room; ``None`` fields are unknown (not a router, or no answer)."""

    max_instances: int | None = None
    autoload: bool | None = None


def read_room(body: bytes) -> Room:
    """The room a ``GET /props`` answer tells: a router's ``max_instances`` (1 to
    :data:`MAX_INSTANCES`) and ``models_autoload``; unknown for anything else."""
    try:
        props = _PROPS.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Room()
    if props.role != "router":
        return Room()
    count = props.max_instances
    believable = count is not None and 1 <= count <= MAX_INSTANCES
    return Room(count if believable else None, props.models_autoload)


class RoomAsks:
    """When each host's room was last asked: once at first, then every
    :data:`ASK_AGAIN_SECONDS`, and again at once after the host failed (:meth:`forget`)."""

    def __init__(self) -> None:
        self._asked: dict[str, float] = {}

    def due(self, host: str, now: float) -> bool:
        """Whether to ask ``host`` now; if so, it counts as asked."""
        last = self._asked.get(host)
        if last is not None and now - last < ASK_AGAIN_SECONDS:
            return False
        self._asked[host] = now
        return True

    def forget(self, host: str) -> None:
        self._asked.pop(host, None)

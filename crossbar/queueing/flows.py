"""Who waits in the fair queue and what it may do: a flow (a client, by name, with its
band and limits), a pool's limit, and a refusal in words. Values only, no I/O."""

from __future__ import annotations

import math
from typing import Any

import attrs

from crossbar.queueing.slotuse import WINDOW_SECONDS


def _optional_ge(low: int) -> Any:
    return attrs.validators.optional(attrs.validators.ge(low))


@attrs.frozen
class Flow:
    """One client, as the caller names it: a key's name or an address, never a key."""

    name: str
    band: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Priority band, 0 first: a band goes only when no lower one has anyone waiting."""
    max_in_flight: int | None = attrs.field(default=None, validator=_optional_ge(1))
    """Past this many running, the flow is passed over until one of them ends."""
    max_waiting: int | None = attrs.field(default=None, validator=_optional_ge(0))
    """Past this many waiting (in all pools), another is refused."""


@attrs.frozen
class PoolLimit:
    """How many may wait in one pool, and the name a refusal gives it (e.g. the route)."""

    name: str
    max_waiting: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen
class Refused:
    """Why :meth:`FairQueue.push` turned a request away: the status, the error in words
    for the client's JSON, and seconds to wait before trying again (``Retry-After``)."""

    status: int
    error: str
    retry_after: int
    reason: str = "limit"
    """Why, in one word for a metric's label: ``limit``, ``timeout`` or ``stopping``."""


def refusal(name: str, limit: int, waited: float) -> Refused:
    """A 429 in words; retry after about as long as the oldest of those waiting has
    waited (roughly how long the queue takes to turn over), 1 s to 5 min."""
    words = f"{limit} requests already waiting" if limit else "every slot is busy, none may wait"
    return Refused(429, f"{name}: {words}", min(WINDOW_SECONDS, max(1, math.ceil(waited))))

"""What the queue answers a request (go now, wait, or refused) and what it asks of those
around it: the waiting request, told later, and, with workers (``workers: N``), the other
workers' waiting requests, so that a slot freed in one worker goes to the request waiting
first in any of them (:mod:`crossbar.sharing` keeps that view)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import attrs

from crossbar.queueing.lanes import Head
from crossbar.queueing.queue import Refused, Waiting

STOPPING = Refused(503, "crossbar is stopping", 5, "stopping")
"""The answer to a request that waits, or would, for a slot of a crossbar that stops."""


class Waiter(Protocol):
    """What a waiting request is to the queue (an :class:`~crossbar.proxy.exchange.Exchange`)."""

    def dispatched(self, waited: float) -> None: ...
    def shed(self, refused: Refused) -> None: ...


@attrs.frozen
class Go:
    """Admitted: choose a host now, leaving out ``full`` (hosts of its group, every slot taken)."""

    full: tuple[str, ...] = ()


@attrs.frozen
class Queued:
    """Admitted to wait: its waiter is told later, by ``dispatched`` or ``shed``."""

    waiting: Waiting[Waiter]
    """Its place in the queue (what :meth:`Waits.leave` takes, if its client leaves)."""


class SlotShare(Protocol):
    """The other workers' waiting requests, and the way to hand them a freed slot."""

    def waiting(self) -> bool:
        """Whether a request waits in another worker (for any pool)."""
        ...

    def ahead(self, pools: Sequence[Hashable], head: Head) -> bool:
        """Whether a request waiting in another worker for ``pools`` comes before ``head``."""
        ...

    def owed(
        self, host: str, model: str | None, pools: Sequence[Hashable], mine: Sequence[Head]
    ) -> bool:
        """Whether a slot of ``host`` for ``model``, just freed here, is owed to a request
        waiting in another worker for ``pools`` before each of ``mine`` (this worker's
        first in each pool): then it has been given over, and this worker does not use it."""
        ...

    def hand_over(self, host: str, model: str | None, pools: Sequence[Hashable]) -> bool:
        """Give a slot of ``host`` freed here to the shared count, whatever this worker
        knows, for it to offer by its own, fresher, order (perhaps back here); ``False``
        when no shared count is heard."""
        ...

    def changed(self) -> None:
        """This worker's counts or waiting requests changed: the others are to be told."""
        ...

"""A process's ``cache_affinity`` placements kept in step with the other processes' (its
workers', through worker 0, or its replicas', through the shared store), while it is
joined to them.

Each placement made here is sent at the end of the reactor's turn, with the others of that
turn in one message; what the others placed is taken into this process's table of
conversations. So a conversation's next turn, which comes after its answer, finds its host
in whichever process gets it. While the link is down, each process places on its own again
(and ranks the conversations it sees others answer), as without sharing.

A turn whose conversation is new here, or moved, is held back until the others have its
placement (:meth:`PlacementSync.told`; at most :data:`MOST_HELD` seconds): its answer,
however short, then cannot end and bring the next turn to another process before that
process knows where the conversation lives. Turns that stay where they were go at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.routing import Conversations, OutgoingPlacements, Placed

MOST_SENT = 4096
"""Placements sent in one message at most; more wait for the next turn of the reactor."""
MOST_HELD = 0.1
"""Seconds a fresh placement's turn waits at most for the others to have it (a slow store
or worker 0 costs a new conversation no more)."""

Send = Callable[[Sequence[Placed]], "Deferred[object]"]
"""How placements go out: fires once the others have them (or they could not be sent)."""


class PlacementSync:
    """Sends this process's placements, and takes the others'."""

    def __init__(
        self, conversations: Conversations, clock: IReactorTime, knows: Callable[[str], bool]
    ) -> None:
        self.conversations, self.clock, self.knows = conversations, clock, knows
        """``knows``: whether a host name is one of this process's config (others are
        left out: the table keeps config's hosts only)."""
        self._send: Send | None = None
        self._due: IDelayedCall | None = None
        self._held: dict[bytes, list[tuple[Deferred[None], IDelayedCall]]] = {}
        """The turns held back for each fresh placement not yet told (:meth:`told`)."""
        self._telling: set[bytes] = set()
        """Fresh placements sent, and not yet answered."""

    @property
    def sharing(self) -> bool:
        return self._send is not None

    def start(self, send: Send) -> None:
        """Joined: placements go out through ``send`` from now on."""
        self._send = send
        if self.conversations.outgoing is None:
            self.conversations.outgoing = OutgoingPlacements(self._soon)

    def stop(self) -> None:
        """The link is lost: this process places on its own until it is back."""
        self._send = None
        self.conversations.outgoing = None
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None
        self._telling.clear()
        for key in list(self._held):
            self._release(key)

    def told(self, key: bytes) -> Deferred[None] | None:
        """Before a turn of conversation ``key`` is sent: ``None`` when the others know its
        host (or nothing is shared), else what fires once they do, or after
        :data:`MOST_HELD` seconds, or when the link is lost."""
        outgoing = self.conversations.outgoing
        if outgoing is None or not (key in outgoing.fresh or key in self._telling):
            return None
        held: Deferred[None] = Deferred()
        later = self.clock.callLater(MOST_HELD, self._release, key, held)
        self._held.setdefault(key, []).append((held, later))
        return held

    def _release(self, key: bytes, only: Deferred[None] | None = None) -> None:
        """The turns held for ``key`` go (``only``: that one, its time being up)."""
        waiting = self._held.pop(key, [])
        going = [w for w in waiting if only is None or w[0] is only]
        if len(going) < len(waiting):
            self._held[key] = [w for w in waiting if w[0] is not only]
        for held, later in going:
            if later.active():
                later.cancel()
            held.callback(None)

    def _answered(self, fresh: set[bytes]) -> None:
        """The others have these placements (or they are lost): their turns go."""
        self._telling -= fresh
        for key in fresh:
            self._release(key)

    def heard(self, placed: Sequence[Placed]) -> None:
        """What other processes placed (the hosts this config does not know left out)."""
        if self._send is not None:
            known = [one for one in placed if self.knows(one.host)]
            self.conversations.heard(known, self.clock.seconds())

    def _soon(self) -> None:
        if self._due is None:
            self._due = self.clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._due = None
        outgoing = self.conversations.outgoing
        if self._send is None or outgoing is None:
            return
        placed, fresh = outgoing.take(MOST_SENT)
        if placed:
            self._telling |= fresh
            sent = self._send(placed)
            if fresh:
                sent.addBoth(lambda _: self._answered(fresh))
        if len(outgoing):
            self._soon()

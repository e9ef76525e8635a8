"""A process's ``cache_affinity`` placements kept in step with the other processes' (its
workers', through worker 0, or its replicas', through the shared store), while it is
joined to them.

Each placement made here is sent at the end of the reactor's turn, with the others of that
turn in one message; what the others placed is taken into this process's table of
conversations. So a conversation's next turn, which comes after its answer, finds its host
in whichever process gets it. While the link is down, each process places on its own again
(and ranks the conversations it sees others answer), as without sharing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.routing import Conversations, OutgoingPlacements, Placed

MOST_SENT = 4096
"""Placements sent in one message at most; more wait for the next turn of the reactor."""


class PlacementSync:
    """Sends this process's placements, and takes the others'."""

    def __init__(
        self, conversations: Conversations, clock: IReactorTime, knows: Callable[[str], bool]
    ) -> None:
        self.conversations, self.clock, self.knows = conversations, clock, knows
        """``knows``: whether a host name is one of this process's config (others are
        left out: the table keeps config's hosts only)."""
        self._send: Callable[[Sequence[Placed]], None] | None = None
        self._due: IDelayedCall | None = None

    @property
    def sharing(self) -> bool:
        return self._send is not None

    def start(self, send: Callable[[Sequence[Placed]], None]) -> None:
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
        placed = outgoing.take(MOST_SENT)
        if placed:
            self._send(placed)
        if len(outgoing):
            self._soon()

"""A replica's conversations kept in step with the others' through the shared store
(``shared_state``), while its link to the store is up.

Each placement ``cache_affinity`` makes here is sent at the end of the reactor's turn (with
the others of that turn, in one call); the store publishes who put, and every other replica
reads what is new since its last read, also at each heartbeat in case a message was lost.
So a conversation's next turn, which comes after its answer, finds its host in any
replica's table. While the store is down each replica places on its own again (and ranks
the conversations it sees others answer), as without a store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from crossbar.routing import Conversations, OutgoingPlacements
from crossbar.sharing.store import Commands
from crossbar.sharing.storeplacements import MOST_PLACEMENTS, Heard, StorePlacements


class PlacementSync:
    """Sends this replica's placements to the store, and reads the others'."""

    def __init__(
        self,
        name: str,
        conversations: Conversations,
        clock: IReactorTime,
        knows: Callable[[str], bool],
    ) -> None:
        self.name, self.conversations, self.clock, self.knows = name, conversations, clock, knows
        self.store: StorePlacements | None = None
        self.failed: Callable[[Failure], None] = lambda _: None
        self._seq = 0
        self._due: IDelayedCall | None = None
        self._reading, self._again = False, False

    def start(self, commands: Commands, failed: Callable[[Failure], None]) -> None:
        """The store is reached through ``commands``; a call that fails goes to ``failed``."""
        self.store, self.failed, self._seq = StorePlacements(commands), failed, 0
        self.conversations.outgoing = OutgoingPlacements(self._soon)
        self.read()

    def stop(self) -> None:
        """The store is lost: this replica places on its own until it is back."""
        self.store = None
        self.conversations.outgoing = None
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None

    def _soon(self) -> None:
        if self._due is None:
            self._due = self.clock.callLater(0, self._send)

    def _send(self) -> None:
        self._due = None
        outgoing = self.conversations.outgoing
        if self.store is None or outgoing is None:
            return
        placed = outgoing.take(MOST_PLACEMENTS)
        if placed:
            self.store.put(self.name, placed).addErrback(self.failed)
        if len(outgoing):
            self._soon()

    def read(self) -> None:
        """Read what is new (once more after, if asked again meanwhile)."""
        if self.store is None:
            return
        if self._reading:
            self._again = True
            return
        self._reading = True
        read = self.store.since(self._seq, self.knows)
        read.addCallbacks(self._heard, self.failed).addBoth(self._read_done)

    def _heard(self, heard: Heard) -> None:
        if self.store is None:
            return
        self._seq = heard.seq
        self.conversations.heard(heard.placed, self.clock.seconds())

    def _read_done(self, _: Any) -> None:
        self._reading = False
        if self._again:
            self._again = False
            self.read()

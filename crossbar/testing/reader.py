"""A streaming body reader: a client of crossbar that sees an answer as it arrives.

Streams are what crossbar is for, so tests need to look at them mid-way (has the first
token come through?), and to leave mid-way like a client that gives up.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from crossbar.testing.timeouts import guard


class Reader(Protocol):
    """Reads an answer's body as it streams (``response.deliverBody(reader)``)."""

    def __init__(self) -> None:
        self.data = b""
        self.reason: Failure | None = None
        self.ended: Deferred[None] = Deferred()
        self._waiting: list[tuple[int, Deferred[bytes]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        ready = [(n, d) for n, d in self._waiting if len(self.data) >= n]
        self._waiting = [(n, d) for n, d in self._waiting if len(self.data) < n]
        for _, d in ready:
            d.callback(self.data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self.reason = reason
        for _, d in self._waiting:
            d.errback(reason)
        self._waiting = []
        self.ended.callback(None)

    def bytes(self, n: int = 1) -> Deferred[bytes]:
        """Fires with all the data so far once at least ``n`` bytes have arrived."""
        d: Deferred[bytes] = Deferred()
        if len(self.data) >= n:
            d.callback(self.data)
        else:
            self._waiting.append((n, d))
        return d

    async def end(self, seconds: float = 5.0) -> Failure:
        """Wait for the end of the body; why it ended (see :func:`broken`)."""
        await guard(self.ended, seconds, "end of the answer")
        assert self.reason is not None
        return self.reason

    def hang_up(self) -> None:
        """Go away mid-answer, as a client that gives up does."""
        transport: Any = self.transport
        transport.stopProducing()


def broken(reason: Failure) -> bool:
    """A body that did not end cleanly: the client can tell the stream is incomplete."""
    return not reason.check(ResponseDone) and not reason.check(PotentialDataLoss)

"""The body of an answer that may be a host's refusal of a long prompt, held back until it
is known whether it is one (:mod:`crossbar.proxy.overflow`).

A ``400`` of at most ``MAX_REFUSAL_BYTES`` is read whole before anything of it goes to the
client; the exchange is then told ``(body, whole)``. A refusal is answered by crossbar (a
retry elsewhere, or the API's own error); anything else, or a body longer than the limit,
is handed over to the protocol that relays answers (:meth:`RefusalBody.hand_over`), which
gets what was held back first, then the rest as it comes, then the body's end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from crossbar.proxy.overflow import MAX_REFUSAL_BYTES


class RefusalBody(Protocol):
    """Holds an answer's first ``limit`` bytes (:data:`MAX_REFUSAL_BYTES` unless told),
    then tells ``read``: also used for a host's model list, given its windows
    (:meth:`~crossbar.proxy.hostanswer.AnswerRelay._listed`)."""

    def __init__(self, read: Callable[[bytes, bool], None], limit: int = MAX_REFUSAL_BYTES) -> None:
        self._limit = limit
        self._read: Callable[[bytes, bool], None] | None = read
        self._held: list[bytes] = []
        self._size = 0
        self._next: Any = None
        self._ended: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        if self._next is not None:
            self._next.dataReceived(data)
            return
        self._held.append(data)
        self._size += len(data)
        if self._size > self._limit:
            self._tell(whole=False)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._next is not None:
            self._next.connectionLost(reason)
            return
        self._ended = reason
        self._tell(whole=True)

    def _tell(self, whole: bool) -> None:
        read, self._read = self._read, None
        if read is not None:
            read(b"".join(self._held), whole)

    def hand_over(self, protocol: Any) -> None:
        """Relay the answer to ``protocol`` after all: what was held back, the rest, the end."""
        self._next = protocol
        protocol.makeConnection(self.transport)
        held, self._held = b"".join(self._held), []
        if held:
            protocol.dataReceived(held)
        if self._ended is not None:
            protocol.connectionLost(self._ended)

    def stop(self) -> None:
        """Nobody wants the rest: the host's connection is closed."""
        transport: Any = self.transport
        if transport is not None and self._ended is None:
            transport.stopProducing()

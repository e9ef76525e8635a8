"""The upstream body on its way to the client: relayed as it arrives, never buffered,
with the client's socket pausing the upstream's (backpressure); a host's answer that may
say it failed to load a model is read that far first (:class:`LoadCheck`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from zope.interface import implementer

from crossbar.http import SPENT, Deadline, stop
from crossbar.polling import LOOKED_AT, failed_load
from crossbar.upstream import stop_producing


class Tap(Protocol):
    """A reader of the chunks relayed (:class:`crossbar.usage.reader.AnswerReader`): each
    chunk to ``feed``, and ``trim(sent)`` once the bytes relayed pass ``due``."""

    @property
    def feed(self) -> Callable[[bytes], None]: ...

    @property
    def due(self) -> float: ...

    def trim(self, sent: int) -> None: ...


class _NoTap:
    due = math.inf

    @staticmethod
    def feed(data: bytes) -> None:
        pass

    @staticmethod
    def trim(sent: int) -> None:
        pass


_NO_TAP: Tap = _NoTap()


@implementer(IPushProducer)
class StreamBody(protocol.Protocol):
    """Carries an answer's body to the client's request chunk by chunk.

    It is given to ``Response.deliverBody`` and registered as the request's producer,
    so a slow client pauses the upstream socket; a pause does not count as the host
    being idle. ``idle_timeout`` without a chunk calls ``on_idle``: a :class:`Deadline`
    whose time each chunk moves by a store (the clock read in one C call on a real
    reactor), not a timer moved on every chunk. The body's end, clean or not, goes to
    ``on_end``. A pause as long as ``idle_timeout`` (a client that
    reads nothing, holding a host's connection and maybe its GPU) calls ``on_stall``.
    ``deadline``: one given it (pointed at ``on_idle`` here, let go at the end: a lent
    one's timer goes on serving its lender); else one of its own. ``tap``: a reader of
    the chunks (:class:`Tap`), if any.
    """

    def __init__(
        self,
        request: server.Request,
        clock: IReactorTime,
        idle_timeout: float,
        on_idle: Callable[[], None],
        on_end: Callable[[Failure], None],
        on_stall: Callable[[], None],
        deadline: Deadline | None = None,
        tap: Tap | None = None,
    ) -> None:
        self.sent = 0
        """Bytes of body relayed to the client."""
        self._write = request.write
        self._clock = clock
        self._now = clock.seconds
        self._idle_timeout = idle_timeout
        if deadline is None:
            deadline = Deadline(clock, on_idle)
        else:
            deadline.on_due = on_idle
        self._idle = deadline
        """Due ``idle_timeout`` after the last chunk, once armed and while not paused;
        :data:`SPENT` once the body is over."""
        self._on_end = on_end
        self._on_stall = on_stall
        self._stall: IDelayedCall | None = None
        self.tap: Tap = _NO_TAP if tap is None else tap
        """Sees every chunk as it is relayed (what the answer says of its work); its
        ``feed`` is looked up for each chunk, since a reader changes it as it goes on."""

    def dataReceived(self, data: bytes) -> None:
        # A store, not Deadline.set: 900 fewer instructions a chunk (5%, instructions.py).
        self._idle.due = self._now() + self._idle_timeout
        self.sent = sent = self.sent + len(data)
        tap = self.tap
        tap.feed(data)
        if sent > tap.due:
            tap.trim(sent)
        self._write(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self._disarm()
        self._on_end(reason)

    def pauseProducing(self) -> None:
        self._idle.let_go()
        if self._stall is None:
            self._stall = self._clock.callLater(self._idle_timeout, self._stalled)
        IPushProducer(self.transport).pauseProducing()

    def resumeProducing(self) -> None:
        stop(self._stall)
        self._stall = None
        self.arm()
        IPushProducer(self.transport).resumeProducing()

    def stopProducing(self) -> None:
        self._disarm()
        stop_producing(self.transport)

    def arm(self) -> None:
        """Start the idle timer (for a body still coming in)."""
        self._idle.set(self._idle_timeout)

    def _disarm(self) -> None:
        self._idle.let_go()
        self._idle = SPENT
        stop(self._stall)
        self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        self._on_stall()


_HELD, _PASSED, _DROPPED = range(3)


class LoadCheck(protocol.Protocol):
    """Holds back the start of a host's ``500`` to a request that made it load a model,
    to read whether the load failed (:func:`crossbar.polling.failed_load`). If it did, the
    answer is dropped (its connection closed, its headers taken back from ``request``) and
    ``on_failed`` is told, for the request to go elsewhere; else the answer goes on to
    ``body`` as it came. It holds at most the bytes looked at for the words."""

    def __init__(self, body: StreamBody, request: server.Request, on_failed: Callable[[], None]):
        self._body, self._request, self._on_failed = body, request, on_failed
        self._start = bytearray()
        self._state = _HELD

    def connectionMade(self) -> None:
        self._body.makeConnection(self.transport)  # pauses and stops act on the host's socket

    def dataReceived(self, data: bytes) -> None:
        if self._state == _PASSED:
            self._body.dataReceived(data)
        elif self._state == _HELD:
            self._start += data
            if len(self._start) >= LOOKED_AT:
                self._decide()

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        if self._state == _HELD:
            self._decide()
        if self._state == _PASSED:
            self._body.connectionLost(reason)

    def _decide(self) -> None:
        start, self._start = bytes(self._start), bytearray()
        if failed_load(500, start):
            self._state = _DROPPED
            self._body.stopProducing()
            self._request.responseHeaders = Headers()
            self._on_failed()
            return
        self._state = _PASSED
        if start:
            self._body.dataReceived(start)

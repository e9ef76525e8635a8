"""The upstream body on its way to the client: relayed as it arrives, never buffered,
with the client's socket pausing the upstream's (backpressure); the start of a host's
answer is held back until its first content, for a host that fails before it to be
retried (:class:`FirstContent`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from zope.interface import implementer

from crossbar.http import SPENT, Deadline, stop
from crossbar.polling import failed_load
from crossbar.upstream import describe, stop_producing


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

    def heard(self) -> None:
        """The host sent something held back (a ping): it is not idle."""
        self._idle.due = self._now() + self._idle_timeout

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


class Opening(Protocol):
    """What :class:`FirstContent` tells of an answer before its first content."""

    def opened(self) -> bool:
        """Its first content is here: the head goes to the client (unless one went out
        already), and the body after it; ``False``: not (the exchange had ended)."""

    def kept_alive(self, comment: bytes) -> None:
        """An SSE comment (a host's ping) came before any content."""

    def failed(self, why: str, held: bytes | None, broke: bool) -> None:
        """The host failed before any content; ``held``: the whole body of its error
        status, when it ended within :data:`HELD_MOST`; ``broke``: its connection broke."""

    def load_failed(self) -> None:
        """Its ``500`` says it failed to load the model (:func:`crossbar.polling.failed_load`)."""


HELD_MOST = 65536
"""Bytes held back at most before an answer's first content: an error status's body, or an
SSE event not yet whole. Past it, the answer is relayed as it came."""

_SEPARATORS = (b"\n\n", b"\r\n\r\n")
_HELD, _EVENTS, _BYTES, _DONE = range(4)


class FirstContent(protocol.Protocol):
    """Holds back a host's answer until its first content, for a host that fails before
    it to be retried on another with nothing a client parses sent twice.

    Content: for a streamed success (``text/event-stream``), its first SSE event that is
    neither a comment (``:`` lines, a host's ping: each told to ``opening.kept_alive``)
    nor an error (``event: error``, ``event: response.failed``, ``data: {"error"...``);
    for any other answer below ``500``, its first body bytes (or its clean end). A status
    of ``500`` or more is held whole (at most :data:`HELD_MOST`), then said to have failed
    (or, a router's failed load, ``load_failed``); a break before content is a failure.
    ``load``: a ``500`` may say a failed load (the model was not loaded there when chosen).
    ``failing``: the least status that is a failure (``400`` once another host's head went
    out: a status can no longer reach the client).
    At its first content it tells ``opening.opened`` and gives the body to ``body``; from
    then on each chunk goes to ``body.dataReceived`` with no step in between."""

    def __init__(
        self,
        body: StreamBody,
        code: int,
        streamed: bool,
        opening: Opening,
        load: bool = False,
        failing: int = 500,
    ) -> None:
        self._body, self._code, self._opening, self._load = body, code, opening, load
        self._start = bytearray()
        self._state = _HELD if code >= failing else _EVENTS if streamed and code < 400 else _BYTES

    def connectionMade(self) -> None:
        self._body.makeConnection(self.transport)  # pauses and stops act on the host's socket

    def dataReceived(self, data: bytes) -> None:
        state = self._state
        if state == _DONE:
            return
        self._body.heard()
        if state == _BYTES:  # below 500, not an event stream: its first bytes are content
            self._open(data)
            return
        self._start += data
        if state == _EVENTS:
            self._read_events()
        elif len(self._start) > HELD_MOST:
            self._open(self._take())

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        state = self._state
        if state == _DONE:
            return
        clean = reason.check(ResponseDone, PotentialDataLoss) is not None
        if state == _HELD:
            start = self._take()
            self._drop()
            if clean and self._load and failed_load(self._code, start):
                self._opening.load_failed()
            else:
                self._opening.failed(f"answered {self._code}", start if clean else None, not clean)
            return
        if not clean:
            self._drop()
            self._opening.failed(f"broke before any content ({describe(reason)})", None, True)
            return
        if self._open(self._take()):  # ended with no content: relayed as it came
            self._body.connectionLost(reason)

    def _read_events(self) -> None:
        start = self._start
        while True:
            end, size = min(
                ((start.find(sep), len(sep)) for sep in _SEPARATORS if sep in start),
                default=(-1, 0),
            )
            if end < 0:
                if len(start) > HELD_MOST:
                    self._open(self._take())
                return
            event = bytes(start[:end])
            lines = event.splitlines()
            if all(line.startswith(b":") for line in lines):
                del start[: end + size]
                self._opening.kept_alive(event + b"\n\n")
                continue
            if any(_error_line(line) for line in lines):
                self._drop()
                self._opening.failed("an error event before any content", None, False)
                return
            self._open(self._take())
            return

    def _take(self) -> bytes:
        start, self._start = bytes(self._start), bytearray()
        return start

    def _drop(self) -> None:
        self._state = _DONE
        self._start = bytearray()
        self._body.stopProducing()

    def _open(self, data: bytes) -> bool:
        """Content: the head goes out, then ``data``; the body takes each chunk after it.
        ``False``: the exchange would not have it (it had ended)."""
        self._state = _DONE
        if not self._opening.opened():
            return False
        body = self._body
        self.dataReceived = body.dataReceived  # type: ignore[method-assign]
        self.connectionLost = body.connectionLost  # type: ignore[method-assign]
        if data:
            body.dataReceived(data)
        return True


def _error_line(line: bytes) -> bool:
    """Whether an SSE line says the stream failed."""
    name, _, value = line.partition(b":")
    value = value.strip()
    if name == b"event":
        return value in (b"error", b"response.failed")
    return name == b"data" and value.startswith(b'{"error"')

"""One kept-alive HTTP/1.1 connection to a host: it sends a request, reads the answer
with :class:`~crossbar.upstream.parsing.AnswerParser` (llhttp), and hands the body to
a protocol as it arrives.

The failures are Twisted's (``ResponseNeverReceived`` before the status line,
``ResponseFailed`` in the body, ``ResponseDone`` at the end), so the proxy reads them
as it would an ``Agent``'s.
"""

from __future__ import annotations

import re
import select
from typing import Any, Protocol

import attrs
from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, ITCPTransport
from twisted.internet.protocol import ClientFactory, connectionDone
from twisted.internet.protocol import Protocol as BodyProtocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import RESPONSES, PotentialDataLoss
from zope.interface import implementer

from crossbar._twisted import direct, write_now
from crossbar.upstream.parsing import AnswerParser, BadAnswer, Head

ANSWER_DONE = Failure(ResponseDone())
"""How every complete answer's body ends: one shared Failure, as Twisted's own
``connectionDone``; building one per answer (its class's parents looked up each time)
cost about 1% of a request."""


class Owner(Protocol):
    """What a connection needs of its pool."""

    def release(self, connection: Connection) -> None:
        """The answer is complete and the connection may be reused."""

    def forget(self, connection: Connection) -> None:
        """The connection is closed."""


class AnswerWaiter(Protocol):
    """The request a connection is answering, until its status line arrives."""

    def answered(self, response: Response) -> None: ...

    def fail(self, reason: Failure) -> None: ...

    def lost(self, connection: Connection, reason: Failure, got_bytes: bool) -> None: ...


@attrs.define(eq=False)
class Response:
    """The status line and headers of an answer; the body follows through ``deliverBody``.

    The body's progress lives here, not on the connection, so that a late reader, or a
    reader stopping after its body ended, can never touch the connection's next answer.
    """

    code: int
    phrase: bytes
    """The host's reason phrase, or the standard one when the host's is not fit to pass on."""
    headers: list[tuple[bytes, bytes]]
    """As sent, in order, names as the host spelled them."""
    length: int | None
    """From ``Content-Length``; ``None`` when chunked or until the connection closes."""
    _connection: Connection
    _protocol: BodyProtocol | None = attrs.field(default=None, init=False)
    _early: list[bytes] = attrs.field(factory=list, init=False)
    _ended: Failure | None = attrs.field(default=None, init=False)
    _stopped: bool = attrs.field(default=False, init=False)

    def deliverBody(self, protocol: BodyProtocol) -> None:
        """Give the body to ``protocol`` as it arrives; its transport is a push producer
        (pause, resume, and stop, which closes the connection)."""
        self._protocol = protocol
        protocol.makeConnection(_BodyControl(self))  # type: ignore[arg-type]
        early, self._early = self._early, []
        for data in early:
            if self._stopped:
                break
            protocol.dataReceived(data)
        if self._ended is not None:
            protocol.connectionLost(self._ended)

    def _data(self, data: bytes) -> None:
        if self._stopped:
            return
        protocol = self._protocol
        if protocol is not None:
            protocol.dataReceived(data)
        else:
            self._early.append(data)

    def _end(self, reason: Failure) -> None:
        if self._ended is None:
            self._ended = reason
            if self._protocol is not None:
                self._protocol.connectionLost(reason)

    def _streaming(self) -> bool:
        """Whether this body is still coming in on its connection."""
        return self._ended is None and self._connection.response is self


@implementer(IPushProducer)
class _BodyControl:
    """What a body protocol sees as its transport: flow control over its connection,
    for as long as its body is coming in."""

    def __init__(self, response: Response) -> None:
        self._response = response

    def pauseProducing(self) -> None:
        if self._response._streaming():
            self._response._connection.pause()

    def resumeProducing(self) -> None:
        if self._response._streaming():
            self._response._connection.resume()

    def stopProducing(self) -> None:
        response = self._response
        response._stopped = True
        if response._streaming():
            response._connection.abort()


MAX_PHRASE = 64
"""Longest reason phrase passed on as the host wrote it."""
_PRINTABLE = re.compile(rb"[\x20-\x7e]*")


def shown_phrase(code: int, phrase: bytes) -> bytes:
    """The reason phrase to pass on to a client: the host's when it is short printable
    ASCII, else the standard one for the code (empty when there is none).

    llhttp takes any byte but CR and LF there; a client may print it, or choke on it.
    """
    if len(phrase) <= MAX_PHRASE and _PRINTABLE.fullmatch(phrase):
        return phrase
    return RESPONSES.get(code, b"")


IDLE, _HEAD, _BODY, _CLOSED = range(4)
"""A connection's states: ``IDLE`` in the pool (any byte from the host drops it),
``_HEAD`` waiting for the status line, ``_BODY`` while the answer's body comes in,
``_CLOSED`` once closing or closed (never reused)."""


class Connection(BodyProtocol):
    """One kept-alive connection to a host; answers one request at a time."""

    def __init__(self, owner: Owner, host: str) -> None:
        self.owner = owner
        self.host = host
        self.origin: object = None
        """The factory that made it: after a reload that gave its host a new address, a
        connection to the old one is not pooled."""
        self.state = IDLE
        self.idle_since = 0.0
        self.reused = False
        self.response: Response | None = None
        self._waiter: AnswerWaiter | None = None
        self._parser = AnswerParser(self._head, self._body, self._end_of_answer)
        self._got_bytes = False
        self._keep_alive = False
        self._paused = False
        self._on_closed: list[Deferred[None]] = []
        self._direct: tcp.Connection | None = None
        self._readable: select.poll | None = None

    def connectionMade(self) -> None:
        self._direct = direct(self.transport)
        if self._direct is not None:
            # One poll(2) with no wait tells whether anything is waiting to be read.
            self._readable = select.poll()
            self._readable.register(self._direct.fileno(), select.POLLIN)
        if ITCPTransport.providedBy(self.transport):
            # A request goes out in one write; never hold it back for an ACK (Nagle).
            self.transport.setTcpNoDelay(True)

    # -- the request --------------------------------------------------------------------------

    def quiet(self) -> bool:
        """Whether an idle connection can be reused: nothing came from the host since its
        last answer, not even the end of the connection, though the reactor may not have
        read it yet. (Asked of plain TCP sockets only: TLS sends records of its own.)"""
        if self.state != IDLE:
            return False
        if self._readable is None or not self._readable.poll(0):
            return True
        # Bytes the host sent unasked, or its end of the connection: out of step either way.
        self.abort()
        return False

    def send(self, waiter: AnswerWaiter, data: tuple[bytes, ...], head_only: bool) -> None:
        self.state = _HEAD
        self._waiter = waiter
        self._got_bytes = False
        self._parser.expect(head_only)
        transport: Any = self.transport
        head, *apart = data
        write_now(self._direct, transport, head)
        for body in apart:  # queued whole: sending part of it now would copy the rest
            transport.write(body)

    def cancel(self) -> None:
        """The caller gave up before the status line: the connection cannot be reused."""
        self._waiter = None
        self.abort()

    # -- bytes in -----------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state in (_BODY, _HEAD):
            self._got_bytes = True
            try:
                self._parser.feed(data)
            except BadAnswer as e:
                self._bad(e)
        elif state == IDLE:
            self.abort()  # a host must not speak unasked

    def _head(self, head: Head) -> None:
        self.state = _BODY
        self._keep_alive = head.keep_alive
        phrase = shown_phrase(head.code, head.phrase)
        response = Response(head.code, phrase, head.headers, head.length, self)
        self.response = response
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.answered(response)

    def _body(self, data: bytes) -> None:
        if self.state == _BODY and self.response is not None:
            self.response._data(data)

    def _end_of_answer(self, extra: bytes) -> None:
        """The whole answer is in: back to the pool, unless the host said otherwise."""
        if self.state != _BODY:
            return
        if extra:
            self.abort()  # bytes after the answer: the connection is out of step
        elif not self._keep_alive:
            self.state = _CLOSED
            self._lose()
        else:
            self.state = IDLE
            if self._paused:
                self.resume()
            self.owner.release(self)
        self._end(ANSWER_DONE)

    def _bad(self, problem: BadAnswer) -> None:
        """An answer crossbar cannot frame: before its head, the request fails; in its
        body, the body is cut off. The connection is dropped either way."""
        waiter, self._waiter = self._waiter, None
        in_body = self.state == _BODY
        self.abort()
        if waiter is not None:
            waiter.fail(Failure(ResponseFailed([Failure(problem)])))
        elif in_body:
            self._end(Failure(ResponseFailed([Failure(problem)])))

    def _end(self, reason: Failure) -> None:
        if self.response is not None:
            self.response._end(reason)

    # -- flow control -------------------------------------------------------------------------

    def pause(self) -> None:
        if self.state == _BODY and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[attr-defined]

    def abort(self) -> None:
        if self.transport is not None and self.state != _CLOSED:
            self.state = _CLOSED
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def _lose(self) -> None:
        if self.transport is not None:
            self.transport.loseConnection()

    def close(self) -> Deferred[None]:
        """Close an idle connection; fires once it is closed."""
        d: Deferred[None] = Deferred()
        self._on_closed.append(d)
        self.state = _CLOSED
        self._lose()
        return d

    # -- the end ------------------------------------------------------------------------------

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        state = self.state
        self.state = _CLOSED
        self.owner.forget(self)
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.lost(self, reason, self._got_bytes)
        elif state == _BODY and self._parser.closed():
            # No length was given: the end of the connection is the end of the body.
            self._end(Failure(PotentialDataLoss()))
        else:
            self._end(Failure(ResponseFailed([reason])))
        for d in self._on_closed:
            d.callback(None)


class ConnectionFactory(ClientFactory):
    noisy = False

    def __init__(self, owner: Owner, host: str) -> None:
        self._owner = owner
        self._host = host

    def buildProtocol(self, addr: Any) -> Connection:
        connection = Connection(self._owner, self._host)
        connection.origin = self
        return connection

"""One kept-alive HTTP/1.1 connection to a host: it sends a request, reads the answer,
and hands the body to a protocol as it arrives.

The failures are Twisted's (``ResponseNeverReceived`` before the status line,
``ResponseFailed`` in the body, ``ResponseDone`` at the end), so the proxy reads them
as it would an ``Agent``'s.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, ITCPTransport
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from zope.interface import implementer

from crossbar._twisted import direct, write_now

if TYPE_CHECKING:
    from crossbar.upstream.pool import Upstreams, _Call

MAX_HEAD = 64 * 1024
"""Largest status line and headers accepted from a host."""

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_NO_BODY_CODES = frozenset({204, 304})


class BadAnswer(Exception):
    """The host's answer is not HTTP/1.1 that crossbar can frame."""


@attrs.define(eq=False)
class Response:
    """The status line and headers of an answer; the body follows through ``deliverBody``.

    The body's progress lives here, not on the connection, so that a late reader, or a
    reader stopping after its body ended, can never touch the connection's next answer.
    """

    code: int
    phrase: bytes
    headers: list[tuple[bytes, bytes]]
    """As sent, in order, names as the host spelled them."""
    length: int | None
    """From ``Content-Length``; ``None`` when chunked or until the connection closes."""
    _connection: Connection
    _protocol: Protocol | None = attrs.field(default=None, init=False)
    _early: list[bytes] = attrs.field(factory=list, init=False)
    _ended: Failure | None = attrs.field(default=None, init=False)
    _stopped: bool = attrs.field(default=False, init=False)

    def deliverBody(self, protocol: Protocol) -> None:
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


_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,15})[ \t]*(?:;[^\r\n]*)?\Z")
MAX_SIZE_LINE = 1024
MAX_TRAILERS = 64 * 1024
_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)


class _Chunked:
    """Decodes a chunked body (RFC 9112, 7.1) as it arrives.

    Each call slices the chunks out of the bytes received; nothing is copied into a
    buffer unless a size line or a chunk's closing CRLF is split across reads. Trailers
    are read and dropped. Raises :class:`BadAnswer` on framing that is not chunked.
    """

    def __init__(self, deliver: Any, finished: Any) -> None:
        self._deliver = deliver
        self._finished = finished
        self._state = _SIZE
        self._left = 0
        self._rest = b""
        self._trailers = 0

    def feed(self, data: bytes) -> None:
        if self._rest:
            data, self._rest = self._rest + data, b""
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state == _DATA:
                take = min(self._left, end - pos)
                self._left -= take
                if self._left == 0:
                    self._state = _CRLF
                self._deliver(data if take == end else data[pos : pos + take])
                pos += take
            elif state in (_SIZE, _TRAILER):
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > MAX_SIZE_LINE and state == _SIZE:
                        raise BadAnswer("chunk size line too long")
                    break
                if state == _TRAILER:
                    if eol == pos:
                        self._state = _DONE
                        self._finished(data[pos + 2 :])
                        return
                    self._trailers += eol + 2 - pos
                    if self._trailers > MAX_TRAILERS:
                        raise BadAnswer("trailers too long")
                else:
                    match = _SIZE_LINE.match(data, pos, eol) if eol - pos <= MAX_SIZE_LINE else None
                    if match is None:
                        raise BadAnswer("bad chunk size")
                    self._left = int(match.group(1), 16)
                    self._state = _DATA if self._left else _TRAILER
                pos = eol + 2
            elif state == _CRLF:
                if end - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise BadAnswer("chunk not followed by CRLF")
                self._state = _SIZE
                pos += 2
            else:
                raise BadAnswer("bytes after the last chunk")
        if pos < end:
            self._rest = data[pos:]
            if self._state == _TRAILER and len(self._rest) + self._trailers > MAX_TRAILERS:
                raise BadAnswer("trailers too long")


IDLE, _HEAD, _BODY, _CLOSED = range(4)


class Connection(Protocol):
    """One kept-alive connection to a host; answers one :class:`_Call` at a time."""

    def __init__(self, pool: Upstreams, host: str) -> None:
        self.pool = pool
        self.host = host
        self.state = IDLE
        self.idle_since = 0.0
        self.reused = False
        self._call: _Call | None = None
        self._head_only = False
        self._buffer = b""
        self._got_bytes = False
        # The body: framing, where it goes, and how it ended.
        self._remaining = -1  # Content-Length bytes still to come; -1 when not so framed
        self._chunks: _Chunked | None = None
        self._keep_alive = False
        self.response: Response | None = None
        self._paused = False
        self._on_closed: list[Deferred[None]] = []
        self._direct: tcp.Connection | None = None

    def connectionMade(self) -> None:
        self._direct = direct(self.transport)
        if ITCPTransport.providedBy(self.transport):
            # A request goes out in one write; never hold it back for an ACK (Nagle).
            self.transport.setTcpNoDelay(True)

    # -- the request --------------------------------------------------------------------------

    def send(self, call: _Call, data: bytes, head_only: bool) -> None:
        self.state = _HEAD
        self._call = call
        self._head_only = head_only
        self._buffer = b""
        self._got_bytes = False
        write_now(self._direct, self.transport, data)

    def cancel(self) -> None:
        """The caller gave up before the status line: the connection cannot be reused."""
        self._call = None
        self.abort()

    # -- bytes in -----------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state == _BODY:
            self._body_bytes(data)
        elif state == _HEAD:
            self._got_bytes = True
            self._buffer += data
            self._head()
        elif state == IDLE:
            self.abort()  # a host must not speak unasked

    def _head(self) -> None:
        while self.state == _HEAD:
            buffer = self._buffer
            end = buffer.find(b"\r\n\r\n")
            if end < 0 or end > MAX_HEAD:
                if len(buffer) > MAX_HEAD:
                    self._fail_head(BadAnswer("status line and headers too long"))
                return
            try:
                response = self._parse(buffer[:end])
            except BadAnswer as e:
                self._fail_head(e)
                return
            self._buffer = b""
            rest = buffer[end + 4 :]
            if response is None:  # 1xx: an interim answer, the real one follows
                self._buffer = rest
                continue
            self.state = _BODY
            call, self._call = self._call, None
            if call is not None:
                call.answered(response)
            if self._remaining == 0:
                self._finished(rest)
            elif rest and self.state == _BODY:
                self._body_bytes(rest)

    def _fail_head(self, problem: BadAnswer) -> None:
        call, self._call = self._call, None
        self.abort()
        if call is not None:
            call.fail(Failure(ResponseFailed([Failure(problem)])))

    def _parse(self, head: bytes) -> Response | None:
        lines = head.split(b"\r\n")
        version, _, status = lines[0].partition(b" ")
        code_text, _, phrase = status.partition(b" ")
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code_text) != 3:
            raise BadAnswer("bad status line")
        if not code_text.isdigit():
            raise BadAnswer("bad status line")
        code = int(code_text)
        if 100 <= code < 200:
            if code == 101:
                raise BadAnswer("protocol switch")
            return None
        headers = []
        length: int | None = None
        chunked = False
        connection = b""
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.match(name):
                raise BadAnswer("bad header line")
            value = value.strip(b" \t")
            headers.append((name, value))
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise BadAnswer("bad Content-Length")
                length = int(value)
            elif lower == b"transfer-encoding":
                chunked = value.rpartition(b",")[2].strip().lower() == b"chunked"
                if not chunked:
                    raise BadAnswer("unsupported Transfer-Encoding")
            elif lower == b"connection":
                connection = value.lower()
        if version == b"HTTP/1.1":
            self._keep_alive = b"close" not in connection
        else:
            self._keep_alive = b"keep-alive" in connection
        self._chunks = None
        self._remaining = -1
        if self._head_only or code in _NO_BODY_CODES:
            self._remaining = 0
        elif chunked:
            length = None
            self._chunks = _Chunked(self._deliver, self._finished)
        elif length is not None:
            self._remaining = length
        else:
            self._keep_alive = False  # the body ends when the connection does
        self.response = Response(code, phrase, headers, length, self)
        return self.response

    def _body_bytes(self, data: bytes) -> None:
        if self._chunks is not None:
            try:
                self._chunks.feed(data)
            except BadAnswer as e:
                self._end(Failure(ResponseFailed([Failure(e)])))
                self.abort()
        elif self._remaining < 0:
            self._deliver(data)
        elif len(data) < self._remaining:
            self._remaining -= len(data)
            self._deliver(data)
        else:
            rest = data[self._remaining :]
            self._deliver(data[: self._remaining])
            self._remaining = 0
            self._finished(rest)

    def _deliver(self, data: bytes) -> None:
        if self.state == _BODY and self.response is not None:
            self.response._data(data)

    def _finished(self, extra: bytes) -> None:
        """The whole body is in: back to the pool, unless the host said otherwise."""
        if self.state != _BODY:
            return
        self._chunks = None
        self._remaining = -1
        if extra:
            self.abort()  # bytes after the answer: the connection is out of step
        elif not self._keep_alive:
            self.state = _CLOSED
            self._lose()
        else:
            self.state = IDLE
            if self._paused:
                self.resume()
            self.pool.release(self)
        self._end(Failure(ResponseDone()))

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
        self.pool.forget(self)
        call, self._call = self._call, None
        if call is not None:
            call.lost(self, reason, self._got_bytes)
        elif state == _BODY and self._chunks is None and self._remaining < 0:
            # No length was given: the end of the connection is the end of the body.
            self._end(Failure(PotentialDataLoss()))
        else:
            self._end(Failure(ResponseFailed([reason])))
        for d in self._on_closed:
            d.callback(None)


class ConnectionFactory(ClientFactory):
    noisy = False

    def __init__(self, pool: Upstreams, host: str) -> None:
        self._pool = pool
        self._host = host

    def buildProtocol(self, addr: Any) -> Connection:
        return Connection(self._pool, self._host)

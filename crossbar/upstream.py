"""The proxy's HTTP/1.1 client for its hosts: kept-alive connections per host, one
request at a time on each, the answer's body handed to a protocol as it arrives.

Twisted's ``Agent`` does the same through layers a proxy does not need and that
cost about a third of crossbar's CPU per request: a URL parsed for every request, a
chain of Deferreds to write a body already in memory, a line-by-line response
parser, a pause and a resume of every pooled connection. Here the request goes out
in one ``write``, the status line and headers are parsed in one pass, and chunked bodies
are sliced out of the bytes as they arrive. The failures are Twisted's
(``ResponseNeverReceived`` before the status line, ``ResponseFailed`` in the body,
``ResponseDone`` at the end), so the proxy reads them as it would an Agent's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
from twisted.internet import error, tcp
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IPushProducer, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from zope.interface import implementer

from crossbar.connect import IDLE_POOL_TIMEOUT, endpoint_for
from crossbar.writing import direct, write_now

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
    _connection: _Connection
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


_IDLE, _HEAD, _BODY, _CLOSED = range(4)


class _Connection(Protocol):
    """One kept-alive connection to a host; answers one :class:`_Call` at a time."""

    def __init__(self, pool: Upstreams, host: str) -> None:
        self.pool = pool
        self.host = host
        self.state = _IDLE
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
        elif state == _IDLE:
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
            self.state = _IDLE
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


class _Factory(ClientFactory):
    noisy = False

    def __init__(self, pool: Upstreams, host: str) -> None:
        self._pool = pool
        self._host = host

    def buildProtocol(self, addr: Any) -> _Connection:
        return _Connection(self._pool, self._host)


class _Call:
    """One request to one host, until its status line arrives.

    A kept-alive connection that the host closed just as it was reused fails before a
    single byte of answer; such a request is sent once more, on a new connection: a host
    closes an idle connection, not one it is answering on. Counting it as a failure would
    mark a healthy host down.
    """

    def __init__(self, pool: Upstreams, host: str, data: bytes, head_only: bool) -> None:
        self.pool = pool
        self.host = host
        self.data = data
        self.head_only = head_only
        self.result: Deferred[Response] = Deferred(self._cancel)
        self._connecting: Deferred[_Connection] | None = None
        self._connection: _Connection | None = None
        self._retried = False
        self._cancelled = False

    def start(self) -> None:
        connection = self.pool.take(self.host)
        if connection is not None:
            self._send(connection)
        else:
            self._connect()

    def _connect(self) -> None:
        d = self.pool.connect(self.host)
        self._connecting = d
        d.addCallbacks(self._connected, self.fail)

    def _connected(self, connection: _Connection) -> None:
        self._connecting = None
        if self.result.called:  # cancelled meanwhile
            self.pool.release(connection)
        else:
            self._send(connection)

    def fail(self, reason: Failure) -> None:
        self._connecting = self._connection = None
        if not self.result.called and not self._cancelled:
            self.result.errback(reason)

    def _send(self, connection: _Connection) -> None:
        self._connection = connection
        connection.send(self, self.data, self.head_only)

    def answered(self, response: Response) -> None:
        self._connection = None
        self.result.callback(response)

    def lost(self, connection: _Connection, reason: Failure, got_bytes: bool) -> None:
        self._connection = None
        if self.result.called:
            return
        stale = connection.reused and not got_bytes and not self._retried
        if stale and reason.check(error.ConnectionDone, error.ConnectionLost):
            self._retried = True
            self._connect()
            return
        self.result.errback(Failure(ResponseNeverReceived([reason])))

    def _cancel(self, result: Deferred[Response]) -> None:
        # The result fails with CancelledError (which addTimeout turns into a timeout),
        # not with whatever cancelling the connection attempt reports.
        self._cancelled = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.cancel()


class Upstreams:
    """Sends requests to the configured hosts over kept-alive connections.

    Idle connections are reused newest first, closed after ``idle_timeout`` seconds
    (one timer for the whole pool), and at most ``max_idle`` are kept per host.
    """

    def __init__(
        self,
        reactor: Any,
        urls: Mapping[str, str],
        connect_timeouts: Mapping[str, float],
        max_idle: int = 64,
        idle_timeout: float = IDLE_POOL_TIMEOUT,
        clock: IReactorTime | None = None,
    ) -> None:
        self._clock: IReactorTime = clock or reactor
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._endpoints: dict[str, IStreamClientEndpoint] = {}
        self._factories: dict[str, _Factory] = {}
        self._prefix: dict[str, bytes] = {}
        self._host_line: dict[str, bytes] = {}
        for name, url in urls.items():
            target = endpoint_for(reactor, url, connect_timeouts.get(name, 5.0))
            self._endpoints[name] = target.endpoint
            self._prefix[name] = target.path.rstrip(b"/")
            self._host_line[name] = b"Host: " + target.authority + b"\r\n"
            self._factories[name] = _Factory(self, name)
        self._idle: dict[str, list[_Connection]] = {name: [] for name in urls}
        self._sweep: Any = None
        self._closed = False

    def request(
        self, host: str, method: bytes, path: bytes, headers: bytes, body: bytes | None
    ) -> Deferred[Response]:
        """Send ``method path`` to ``host``; ``headers`` are whole lines (``Name: value\\r\\n``),
        without ``Host`` and ``Content-Length``, which are added here. Fires with the
        :class:`Response` once its headers are in; cancelling closes the connection."""
        head = [method, b" ", self._prefix[host], path, b" HTTP/1.1\r\n", self._host_line[host]]
        head.append(headers)
        if body is not None:
            head.append(b"Content-Length: %d\r\n\r\n" % len(body))
            head.append(body)
        else:
            head.append(b"\r\n")
        call = _Call(self, host, b"".join(head), method == b"HEAD")
        call.start()
        return call.result

    # -- the pool -----------------------------------------------------------------------------

    def connect(self, host: str) -> Deferred[_Connection]:
        d: Deferred[Any] = self._endpoints[host].connect(self._factories[host])
        return d

    def take(self, host: str) -> _Connection | None:
        idle = self._idle[host]
        while idle:
            connection = idle.pop()
            if connection.idle_since <= self._clock.seconds() - self._idle_timeout:
                # Stale, and so is everything older beneath it.
                idle.append(connection)
                self._expire(host, len(idle))
                return None
            if connection.state == _IDLE:  # not closing already
                connection.reused = True
                return connection
        return None

    def release(self, connection: _Connection) -> None:
        """A connection whose answer is complete: keep it for the next request."""
        if connection.state != _IDLE:
            return
        idle = self._idle[connection.host]
        if len(idle) >= self._max_idle or self._closed:
            connection.abort()
            return
        connection.idle_since = self._clock.seconds()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self._clock.callLater(self._idle_timeout, self._swept)

    def forget(self, connection: _Connection) -> None:
        idle = self._idle[connection.host]
        if idle and connection in idle:
            idle.remove(connection)

    def _swept(self) -> None:
        self._sweep = None
        deadline = self._clock.seconds() - self._idle_timeout
        oldest = None
        for host, idle in self._idle.items():
            stale = sum(1 for c in idle if c.idle_since <= deadline)
            self._expire(host, stale)
            if idle and (oldest is None or idle[0].idle_since < oldest):
                oldest = idle[0].idle_since
        if oldest is not None:
            delay = max(oldest + self._idle_timeout - self._clock.seconds(), 0.01)
            self._sweep = self._clock.callLater(delay, self._swept)

    def _expire(self, host: str, count: int) -> list[Deferred[None]]:
        idle = self._idle[host]
        stale, idle[:count] = idle[:count], []
        return [connection.close() for connection in stale]

    def close(self) -> Deferred[Any]:
        """Close the idle connections and keep no more (crossbar is stopping)."""
        self._closed = True
        return self.drop_idle()

    def drop_idle(self) -> Deferred[Any]:
        """Close the idle connections; fires once they are closed (answers still
        streaming are left to finish or be cut off by their own side)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        closing = [d for host in self._idle for d in self._expire(host, len(self._idle[host]))]
        return DeferredList(closing)

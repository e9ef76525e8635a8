"""The proxy's own HTTP/1.1 client (:mod:`crossbar.upstream`), against scripted hosts.

Every test runs over real loopback sockets: a small raw-TCP server written here records
the exact bytes of each request it receives and answers with exact bytes, written when
the test says so. What is checked is what a user of the proxy would notice: the bytes
a host gets, the answer and its body as they arrive, how each kind of answer ends,
which connections are kept, reused, retried or closed, and when.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest
import pytest_twisted
from twisted.internet import error
from twisted.internet.defer import CancelledError, Deferred, DeferredList, DeferredQueue
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss

from crossbar.upstream import Response, Upstreams, endpoint_for
from crossbar.upstream.parsing import BadAnswer

T = TypeVar("T")
H = "gpu-a"
"""The one host name the pools in these tests know."""

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


async def guard(d: Deferred[T], seconds: float = 1.0) -> T:
    """Await ``d``; a missing event fails the test instead of hanging it."""
    d.addTimeout(seconds, _reactor())
    return await d


async def turns(n: int = 5) -> None:
    """Let the reactor run a few times (for bytes and closes to cross loopback)."""
    for _ in range(n):
        await deferLater(_reactor(), 0.001, lambda: None)


# -- a scripted host ----------------------------------------------------------------------------


class HostConnection(Protocol):
    """One connection at the scripted host: records what arrives, writes what it is told."""

    def __init__(self, host: ScriptedHost) -> None:
        self.host = host
        self.reads: list[bytes] = []
        """Each ``dataReceived``, as it came."""
        self.requests: list[bytes] = []
        """Each complete request (head and body), exactly as received."""
        self.closed: Deferred[None] = Deferred()
        self.open = False
        self._buffer = b""

    def connectionMade(self) -> None:
        self.open = True
        self.host.connections.append(self)

    def dataReceived(self, data: bytes) -> None:
        self.reads.append(data)
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self._buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            size = end + 4 + length
            if len(self._buffer) < size:
                return
            request, self._buffer = self._buffer[:size], self._buffer[size:]
            self.requests.append(request)
            self.host.received(self, request)

    def connectionLost(self, reason: Failure = Failure(error.ConnectionDone())) -> None:  # noqa: B008
        self.open = False
        self.closed.callback(None)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def lose(self) -> None:
        assert self.transport is not None
        self.transport.loseConnection()


Handler = Callable[[HostConnection, bytes], None]


class ScriptedHost(Factory):
    """A loopback host. Requests go to ``handler`` when there is one, else to a queue the
    test reads with :meth:`next` and answers itself, step by step."""

    noisy = False

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler
        self.connections: list[HostConnection] = []
        self.queue: DeferredQueue[tuple[HostConnection, bytes]] = DeferredQueue()
        self.port: Any = None

    def buildProtocol(self, addr: Any) -> HostConnection:
        return HostConnection(self)

    def received(self, connection: HostConnection, request: bytes) -> None:
        if self.handler is not None:
            self.handler(connection, request)
        else:
            self.queue.put((connection, request))

    async def next(self) -> tuple[HostConnection, bytes]:
        """The next request that arrives, and the connection it came on."""
        return await guard(self.queue.get())

    @property
    def number(self) -> int:
        return int(self.port.getHost().port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.number}"

    @property
    def open_connections(self) -> list[HostConnection]:
        return [c for c in self.connections if c.open]


def answers(*data: bytes) -> Handler:
    """A handler that answers the n-th request with ``data[n]`` (the last one after that)."""
    seen = [0]

    def handler(connection: HostConnection, request: bytes) -> None:
        connection.write(data[min(seen[0], len(data) - 1)])
        seen[0] += 1

    return handler


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


class Rig:
    """Hosts and pools made by a test, all closed at its end."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.hosts: list[ScriptedHost] = []
        self.pools: list[Upstreams] = []

    def host(self, handler: Handler | None = None) -> ScriptedHost:
        host = ScriptedHost(handler)
        host.port = self.reactor.listenTCP(0, host, interface="127.0.0.1")
        self.hosts.append(host)
        return host

    def upstreams(self, url: str, **options: Any) -> Upstreams:
        pool = Upstreams(self.reactor, {H: url}, {H: 2.0}, **options)
        self.pools.append(pool)
        return pool

    async def asked(
        self,
        method: bytes = b"GET",
        path: bytes = b"/",
        headers: bytes = b"",
        body: bytes | None = None,
    ) -> tuple[ScriptedHost, Upstreams, HostConnection, Deferred[Response]]:
        """A host and a pool, with one request sent: the connection that received it."""
        host = self.host()
        pool = self.upstreams(host.url)
        d = pool.request(H, method, path, headers, body)
        connection, _ = await host.next()
        return host, pool, connection, d

    async def close(self) -> None:
        for pool in self.pools:
            await guard(pool.close())
        for host in self.hosts:
            await host.port.stopListening()
            still_open = host.open_connections
            for connection in still_open:
                assert connection.transport is not None
                connection.transport.abortConnection()  # type: ignore[attr-defined]
            await guard(DeferredList([c.closed for c in still_open]))


@pytest_twisted.async_yield_fixture
async def rig(reactor: Any) -> AsyncIterator[Rig]:
    made = Rig(reactor)
    yield made
    await made.close()


# -- a body reader ------------------------------------------------------------------------------


class Body(Protocol):
    """Takes a response body: every piece as it arrives, and how the body ended."""

    def __init__(self) -> None:
        self.data = b""
        self.received: list[bytes] = []
        """Each ``dataReceived``."""
        self.pieces: DeferredQueue[bytes] = DeferredQueue()
        self.reasons: list[Failure] = []
        self._done: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        self.received.append(data)
        self.pieces.put(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self.reasons.append(reason)
        if not self._done.called:
            self._done.callback(None)

    @property
    def producer(self) -> IPushProducer:
        return IPushProducer(self.transport)

    async def ended(self) -> Failure:
        """How the body ended; it must end exactly once."""
        await guard(self._done)
        assert len(self.reasons) == 1, self.reasons
        return self.reasons[0]


def read(response: Response) -> Body:
    """A reader given the answer's body."""
    reader = Body()
    response.deliverBody(reader)
    return reader


async def finish(d: Deferred[Response]) -> tuple[Response, Body, Failure]:
    """The answer, its whole body, and how that body ended.

    A request fires inside the client's ``dataReceived``, before the rest of that read
    is handled: only once the body has ended is its connection back in the pool.
    """
    response = await guard(d)
    reader = read(response)
    return response, reader, await reader.ended()


async def fetch(
    pool: Upstreams,
    method: bytes = b"GET",
    path: bytes = b"/v1/models",
    headers: bytes = b"",
    body: bytes | None = None,
) -> tuple[Response, Body, Failure]:
    """A whole request to the pool's host."""
    return await finish(pool.request(H, method, path, headers, body))


# -- the request on the wire --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "authority", "path"),
    [
        ("http://10.0.0.1:8080/base", b"10.0.0.1:8080", b"/base"),
        ("http://10.0.0.1:80/base", b"10.0.0.1", b"/base"),
        ("http://10.0.0.1", b"10.0.0.1", b""),
        ("https://gpu.lab:443/v1", b"gpu.lab", b"/v1"),
        ("https://gpu.lab", b"gpu.lab", b""),
        ("http://gpu.lab:443", b"gpu.lab:443", b""),
        ("https://gpu.lab:80", b"gpu.lab:80", b""),
        ("http://[::1]:8081/base", b"[::1]:8081", b"/base"),
        ("http://[fe80::1]", b"[fe80::1]", b""),
    ],
)
def test_host_header_omits_the_default_port_and_brackets_ipv6(
    reactor: Any, url: str, authority: bytes, path: bytes
) -> None:
    """The ``Host`` value a host gets: a port only when it is not the scheme's default
    (some servers route on it), an IPv6 address in brackets; the base URL's path kept."""
    target = endpoint_for(reactor, url, 1.0)
    assert (target.authority, target.path) == (authority, path)


@pytest_twisted.ensureDeferred
async def test_request_is_sent_byte_for_byte_in_one_piece(rig: Rig) -> None:
    """Request line with the base URL's path in front, ``Host``, the caller's header lines
    untouched, then ``Content-Length`` and the body: all in one write, so a host gets the
    whole request in one read. A GET without a body gets no ``Content-Length``."""
    host = rig.host(answers(OK))
    pool = Upstreams(
        rig.reactor,
        {"based": host.url + "/base/", "bare": host.url},
        {"based": 2.0, "bare": 2.0},
    )
    rig.pools.append(pool)
    headers = b"Content-Type: application/json\r\nX-Trace:  a b \r\n"
    body = b'{"model": "tiny", "prompt": "h\xc3\xa9"}'
    for name in ("based", "bare"):
        await finish(pool.request(name, b"POST", b"/v1/completions?x=1", headers, body))
        await finish(pool.request(name, b"GET", b"/v1/models", b"Accept: */*\r\n", None))
    authority = b"127.0.0.1:%d" % host.number
    post = (
        b"POST /base/v1/completions?x=1 HTTP/1.1\r\nHost: "
        + authority
        + b"\r\nContent-Type: application/json\r\nX-Trace:  a b \r\n"
        + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    get = b"GET /base/v1/models HTTP/1.1\r\nHost: " + authority + b"\r\nAccept: */*\r\n\r\n"
    based, bare = host.connections
    assert based.requests == [post, get]
    assert based.reads == [post, get]  # each request arrived in one piece
    assert bare.requests == [post.replace(b"/base", b""), get.replace(b"/base", b"")]
    assert bare.reads == bare.requests


# -- how answers end, and which connections are kept ---------------------------------------------


@pytest_twisted.ensureDeferred
async def test_content_length_answer_and_the_connection_is_reused(rig: Rig) -> None:
    """Status, phrase and headers as the host sent them (order, spelling, repeats), the
    length, the body, ``ResponseDone``; the next request goes on the same connection."""
    answer = (
        b"HTTP/1.1 200 All Good\r\nX-Request-ID: abc\r\ncontent-TYPE: application/json\r\n"
        b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Spaced: \t v \t\r\nContent-Length: 11\r\n"
        b"\r\nhello world"
    )
    host = rig.host(answers(answer, ok(b"second")))
    pool = rig.upstreams(host.url)
    response, body, reason = await fetch(pool)
    assert (response.code, response.phrase, response.length) == (200, b"All Good", 11)
    assert response.headers == [
        (b"X-Request-ID", b"abc"),
        (b"content-TYPE", b"application/json"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
        (b"X-Spaced", b"v"),
        (b"Content-Length", b"11"),
    ]
    assert body.data == b"hello world"
    assert reason.check(ResponseDone)
    response, body, reason = await fetch(pool)
    assert body.data == b"second" and reason.check(ResponseDone)
    assert len(host.connections) == 1
    assert len(host.connections[0].requests) == 2


@pytest_twisted.ensureDeferred
async def test_body_that_arrived_before_delivery_is_kept_for_the_reader(rig: Rig) -> None:
    """A reader given the body late still gets all of it, and its end."""
    _host, _pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
    response = await guard(d)
    await turns()
    connection.write(b"lo")
    await turns()
    reader = read(response)
    assert (await reader.ended()).check(ResponseDone)
    assert reader.data == b"hello"


@pytest_twisted.ensureDeferred
async def test_chunked_answer_is_delivered_chunk_by_chunk(rig: Rig) -> None:
    """Streamed tokens reach the reader as the host sends them (the host sends each
    chunk only once the previous one was delivered), decoded, even a chunk split over
    two writes; the end is ``ResponseDone`` and the connection is reused."""
    host, pool, connection, d = await rig.asked(b"POST", b"/v1/chat/completions", b"", b"{}")
    connection.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    response = await guard(d)
    assert (response.code, response.length) == (200, None)
    reader = read(response)
    for piece in [b"data: 1\n\n", b"data: 22\n\n", b"data: 333\n\n"]:
        connection.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        assert await guard(reader.pieces.get()) == piece
    connection.write(b"9\r\ndata:")
    assert await guard(reader.pieces.get()) == b"data:"
    connection.write(b" 4\n\n\r\n")
    assert await guard(reader.pieces.get()) == b" 4\n\n"
    connection.write(b"0\r\n\r\n")
    assert (await reader.ended()).check(ResponseDone)
    assert reader.data == b"data: 1\n\ndata: 22\n\ndata: 333\n\ndata: 4\n\n"
    d = pool.request(H, b"GET", b"/health", b"", None)
    again, _ = await host.next()
    assert again is connection
    again.write(OK)
    await finish(d)


CHUNKED = (
    b"4;name=value\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n"
    b"0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n"
)


async def trickle(connection: HostConnection, data: bytes) -> None:
    """Write ``data`` a byte at a time, letting the reactor turn between bytes."""
    for i in range(len(data)):
        connection.write(data[i : i + 1])
        await deferLater(_reactor(), 0, lambda: None)


@pytest.mark.parametrize("split", [False, True], ids=["at once", "byte by byte"])
@pytest_twisted.ensureDeferred
async def test_chunked_framing_extensions_trailers_and_splits(rig: Rig, split: bool) -> None:
    """Chunk extensions, upper-case sizes and trailers are valid chunked framing, wherever
    the reads split it (a size line, a chunk's CRLF, the trailers); the body is decoded
    whole and the next answer on the connection is read from its first byte."""
    host, pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    response = await guard(d)
    reader = read(response)
    if split:
        await trickle(connection, CHUNKED)
    else:
        connection.write(CHUNKED)
    assert (await reader.ended()).check(ResponseDone)
    assert reader.data == b"Wikipedia in\r\n\r\nchunks."
    d = pool.request(H, b"GET", b"/", b"", None)
    again, _ = await host.next()
    assert again is connection
    again.write(ok(b"next"))
    _, body, _ = await finish(d)
    assert body.data == b"next"


@pytest_twisted.ensureDeferred
async def test_answer_without_length_ends_with_the_connection(rig: Rig) -> None:
    """No ``Content-Length`` and not chunked: the body runs until the host closes, which
    ends it with ``PotentialDataLoss``; the next request opens a new connection."""
    host, pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nsome ")
    response = await guard(d)
    assert response.length is None
    reader = read(response)
    assert await guard(reader.pieces.get()) == b"some "
    connection.write(b"more")
    assert await guard(reader.pieces.get()) == b"more"
    connection.lose()
    assert (await reader.ended()).check(PotentialDataLoss)
    assert reader.data == b"some more"
    d = pool.request(H, b"GET", b"/", b"", None)
    second, _ = await host.next()
    assert second is not connection
    second.write(OK)
    await finish(d)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: Close\r\n",
        b"HTTP/1.0 200 OK\r\n",
    ],
    ids=["1.1 close", "1.1 Close", "1.0"],
)
@pytest_twisted.ensureDeferred
async def test_answer_that_ends_the_connection_is_not_reused(rig: Rig, head: bytes) -> None:
    """``Connection: close``, or HTTP/1.0 without keep-alive: the body is complete, then
    crossbar closes the connection itself (the host need not), and uses a new one."""
    host = rig.host(answers(head + b"Content-Length: 2\r\n\r\nok", OK))
    pool = rig.upstreams(host.url)
    _, body, reason = await fetch(pool)
    assert body.data == b"ok" and reason.check(ResponseDone)
    await guard(host.connections[0].closed)  # closed by crossbar, not by the host
    await fetch(pool)
    assert len(host.connections) == 2


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"],
    ids=["1.1", "1.0 keep-alive"],
)
@pytest_twisted.ensureDeferred
async def test_answer_that_keeps_the_connection_is_reused(rig: Rig, head: bytes) -> None:
    """HTTP/1.1 by default, HTTP/1.0 with ``Connection: keep-alive``: kept and reused."""
    host = rig.host(answers(head + b"Content-Length: 2\r\n\r\nok"))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    await fetch(pool)
    assert len(host.connections) == 1
    assert host.connections[0].open


@pytest.mark.parametrize(
    ("method", "head"),
    [
        (b"GET", b"HTTP/1.1 204 No Content\r\n\r\n"),
        (b"GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n"),
        (b"GET", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"),
        (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"),
    ],
    ids=["204", "304 with length", "304 chunked", "HEAD"],
)
@pytest_twisted.ensureDeferred
async def test_answer_without_a_body_ends_at_once(rig: Rig, method: bytes, head: bytes) -> None:
    """204, 304 and answers to HEAD have no body whatever their headers say: the body
    ends at once (no wait for bytes that never come) and the next answer on the same
    connection is read from its first byte."""
    host = rig.host(answers(head, ok(b"after")))
    pool = rig.upstreams(host.url)
    response, body, reason = await fetch(pool, method=method)
    assert reason.check(ResponseDone) and body.data == b""
    if method == b"HEAD":
        assert response.length == 1234  # what a GET would have sent
    response, body, reason = await fetch(pool)
    assert (response.code, body.data) == (200, b"after") and reason.check(ResponseDone)
    assert len(host.connections) == 1


FINAL = b"HTTP/1.1 201 Created\r\nX-Final: yes\r\nContent-Length: 4\r\n\r\ndone"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"


@pytest.mark.parametrize(
    "writes",
    [[CONTINUE, HINTS, FINAL], [CONTINUE + HINTS + FINAL]],
    ids=["separate", "together"],
)
@pytest_twisted.ensureDeferred
async def test_interim_answers_are_skipped(rig: Rig, writes: list[bytes]) -> None:
    """``100 Continue`` and other 1xx answers are not the answer: the request fires with
    the final one, its headers only, and its body."""
    _host, _pool, connection, d = await rig.asked(
        b"POST", b"/v1/completions", b"Expect: 100-continue\r\n", b"{}"
    )
    for data in writes[:-1]:
        connection.write(data)
        await turns(2)
        assert not d.called
    connection.write(writes[-1])
    response, body, reason = await finish(d)
    assert (response.code, response.headers) == (
        201,
        [(b"X-Final", b"yes"), (b"Content-Length", b"4")],
    )
    assert body.data == b"done" and reason.check(ResponseDone)


@pytest.mark.parametrize(
    ("status_line", "code", "phrase"),
    [
        (b"HTTP/1.1 200 OK", 200, b"OK"),
        (b"HTTP/1.1 404 Model Not Here (try gpu-b)", 404, b"Model Not Here (try gpu-b)"),
        (b"HTTP/1.1 200 " + b"x" * 64, 200, b"x" * 64),
        (b"HTTP/1.1 200", 200, b""),
        (b"HTTP/1.1 200 " + b"x" * 65, 200, b"OK"),
        (b"HTTP/1.1 503 Busy\x00\x1b[31m", 503, b"Service Unavailable"),
        (b"HTTP/1.1 404 Not\tFound", 404, b"Not Found"),
        (b"HTTP/1.1 200 \xc3\xa9t\xc3\xa9", 200, b"OK"),
        (b"HTTP/1.1 200 O\x7fK", 200, b"OK"),
        (b"HTTP/1.1 299 \x01", 299, b""),
    ],
    ids=[
        "plain",
        "own words",
        "64 bytes",
        "none",
        "65 bytes",
        "NUL and escape",
        "tab",
        "not ascii",
        "DEL",
        "unknown code",
    ],
)
@pytest_twisted.ensureDeferred
async def test_reason_phrase_is_passed_on_only_when_short_printable_ascii(
    rig: Rig, status_line: bytes, code: int, phrase: bytes
) -> None:
    """A host's reason phrase reaches the client as it was only when it is printable
    ASCII of at most 64 bytes; else the standard phrase of its code (none for a code
    without one). The answer itself is good: its body comes through."""
    host = rig.host(answers(status_line + b"\r\nContent-Length: 2\r\n\r\nok"))
    pool = rig.upstreams(host.url)
    response, body, reason = await fetch(pool)
    assert (response.code, response.phrase) == (code, phrase)
    assert body.data == b"ok" and reason.check(ResponseDone)


# -- bad answers ---------------------------------------------------------------------------------

BIG = b"X-Big: " + b"a" * (70 * 1024)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Broken header\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + BIG,
        b"HTTP/1.1 200 OK\r\n" + BIG + b"\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 999 Nine\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Split: a\rInjected: b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Split: a\nInjected: b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Nul: a\x00b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 O\rX-Injected: 1\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 O\nX-Injected: 1\r\nContent-Length: 0\r\n\r\n",
        CONTINUE * 11 + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        CONTINUE * 10_000,
    ],
    ids=[
        "bad status code",
        "not http",
        "header line without colon",
        "conflicting content-length",
        "unreadable content-length",
        "unsupported transfer-encoding",
        "protocol switch",
        "header block over 64 KiB, unfinished",
        "header block over 64 KiB, complete",
        "content-length and transfer-encoding",
        "transfer-encoding and content-length",
        "status code over 599",
        "bare CR in a header value",
        "bare LF in a header value",
        "NUL in a header value",
        "bare CR in the reason phrase",
        "bare LF in the reason phrase",
        "eleven interim answers",
        "endless interim answers",
    ],
)
@pytest_twisted.ensureDeferred
async def test_malformed_answer_fails_the_request(rig: Rig, answer: bytes) -> None:
    """An answer crossbar cannot frame fails the request with ``ResponseFailed`` (the
    proxy answers 502) at once, and the connection is closed by crossbar: the host keeps
    its side open."""
    host = rig.host(answers(answer))
    pool = rig.upstreams(host.url)
    with pytest.raises(ResponseFailed) as failed:
        await guard(pool.request(H, b"GET", b"/", b"", None))
    assert failed.value.reasons[0].check(BadAnswer)
    await guard(host.connections[0].closed)


@pytest_twisted.ensureDeferred
async def test_malformed_chunk_fails_the_body(rig: Rig) -> None:
    """A bad chunk size is found in the body: it ends with ``ResponseFailed`` after the
    good chunks were delivered, and the connection is closed."""
    host = rig.host(
        answers(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\nbad\r\n")
    )
    pool = rig.upstreams(host.url)
    _, body, reason = await fetch(pool)
    assert reason.check(ResponseFailed)
    assert body.data == b"ok"
    await guard(host.connections[0].closed)


@pytest.mark.parametrize(
    "rest",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nEXTRA",
    ],
    ids=["content-length", "chunked"],
)
@pytest_twisted.ensureDeferred
async def test_bytes_after_the_body_close_the_connection(rig: Rig, rest: bytes) -> None:
    """Bytes past the end of a complete body mean the connection is out of step: the body
    is still complete, but the connection is closed, not reused."""
    host = rig.host(answers(rest, OK))
    pool = rig.upstreams(host.url)
    _, body, reason = await fetch(pool)
    assert body.data == b"ok" and reason.check(ResponseDone)
    await guard(host.connections[0].closed)
    await fetch(pool)
    assert len(host.connections) == 2


@pytest.mark.parametrize(
    ("method", "answer"),
    [
        (b"GET", b"HTTP/1.1 204 No Content\r\n\r\nEXTRA"),
        (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    ],
    ids=["204", "HEAD"],
)
@pytest_twisted.ensureDeferred
async def test_bytes_after_a_bodiless_answer_close_the_connection(
    rig: Rig, method: bytes, answer: bytes
) -> None:
    """The same for an answer that has no body: bytes after its head (a host that sends a
    body to HEAD, or with a 204) mean the connection is out of step, even when they come
    in the same packet as the head. Reused, the next answer would be read from them."""
    host = rig.host(answers(answer, OK))
    pool = rig.upstreams(host.url)
    _, _, reason = await fetch(pool, method=method)
    assert reason.check(ResponseDone)
    await guard(host.connections[0].closed)
    await fetch(pool)
    assert len(host.connections) == 2


@pytest_twisted.ensureDeferred
async def test_host_speaking_unasked_on_an_idle_connection_closes_it(rig: Rig) -> None:
    """Bytes on a connection with no request out cannot belong to any answer."""
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    host.connections[0].write(b"HTTP/1.1 200 OK\r\n")
    await guard(host.connections[0].closed)
    await fetch(pool)
    assert len(host.connections) == 2


@pytest.mark.parametrize("unasked", [b"HTTP/1.1 200 OK\r\n", b""], ids=["bytes", "close"])
@pytest_twisted.ensureDeferred
async def test_idle_connection_the_host_spoke_on_is_not_reused(rig: Rig, unasked: bytes) -> None:
    """Bytes (or the end of the connection) that reached an idle connection's socket but
    that the reactor has not read yet: the connection is dropped when it is taken, and the
    request goes out on a new one, never answered from those bytes, never failed."""
    host = rig.host(answers(OK, ok(b"fresh")))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    sock = host.connections[0].transport.getHandle()  # type: ignore[union-attr]
    if unasked:
        sock.send(unasked)  # straight to the socket: no reactor turn in between
    else:
        sock.shutdown(socket.SHUT_WR)
    response, body, reason = await fetch(pool)
    assert (response.code, body.data) == (200, b"fresh") and reason.check(ResponseDone)
    assert len(host.connections) == 2
    assert len(host.connections[0].requests) == 1


@pytest_twisted.ensureDeferred
async def test_requests_go_out_without_waiting_for_acks(rig: Rig) -> None:
    """A request leaves in one write, which Nagle's algorithm must not hold back: the
    upstream socket has TCP_NODELAY."""
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    connection = pool.take(H)
    assert connection is not None and connection.transport is not None
    sock = connection.transport.getHandle()  # type: ignore[attr-defined]
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    pool.release(connection)


# -- no answer -----------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_fresh_connection_closed_without_an_answer(rig: Rig) -> None:
    """The host took the request and closed: ``ResponseNeverReceived``, and it is not sent
    again (the host may have acted on it)."""
    host = rig.host(lambda connection, request: connection.lose())
    pool = rig.upstreams(host.url)
    with pytest.raises(ResponseNeverReceived):
        await guard(pool.request(H, b"POST", b"/v1/completions", b"", b"{}"))
    assert len(host.connections) == 1


@pytest_twisted.ensureDeferred
async def test_port_nobody_listens_on_is_refused(rig: Rig) -> None:
    """A host that is down fails at once with the error the proxy fails over on."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    pool = rig.upstreams(f"http://127.0.0.1:{port}")
    with pytest.raises(error.ConnectionRefusedError):
        await guard(pool.request(H, b"GET", b"/", b"", None))


@pytest_twisted.ensureDeferred
async def test_kept_connection_closed_as_it_is_reused_is_retried_once(rig: Rig) -> None:
    """A kept connection the host closes just as the next request arrives (llama-server
    closing an idle one): the request is sent again, the same bytes, on a new connection,
    and succeeds."""
    host = rig.host()
    pool = rig.upstreams(host.url)
    d = pool.request(H, b"POST", b"/v1/completions", b"", b'{"n": 1}')
    first, request_1 = await host.next()
    first.write(OK)
    await finish(d)
    d = pool.request(H, b"POST", b"/v1/completions", b"", b'{"n": 2}')
    dropped, request_2 = await host.next()
    assert dropped is first
    first.lose()
    second, again = await host.next()
    assert second is not first and again == request_2
    second.write(ok(b"second"))
    reader = Body()
    (await guard(d)).deliverBody(reader)
    assert (await reader.ended()).check(ResponseDone) and reader.data == b"second"
    assert first.requests == [request_1, request_2]
    assert second.requests == [request_2]


@pytest_twisted.ensureDeferred
async def test_kept_connection_closed_just_before_the_request_is_retried(rig: Rig) -> None:
    """The host closes an idle connection and the request goes out on it before crossbar
    could notice (the host never reads it): sent again on a new connection."""
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    first = host.connections[0]
    host.handler = answers(ok(b"second"))
    first.lose()  # both happen before the reactor runs again
    _, body, reason = await fetch(pool, b"POST", b"/v1/completions", b"", b'{"n": 2}')
    assert body.data == b"second" and reason.check(ResponseDone)
    second = host.connections[1]
    assert len(first.requests) == 1 and len(second.requests) == 1
    assert second.requests[0].endswith(b'{"n": 2}')


@pytest_twisted.ensureDeferred
async def test_a_retry_that_fails_alike_is_not_retried_again(rig: Rig) -> None:
    """If the new connection is closed the same way, the request fails: one retry only."""
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    host.handler = lambda connection, request: connection.lose()
    with pytest.raises(ResponseNeverReceived):
        await guard(pool.request(H, b"GET", b"/", b"", None))
    assert len(host.connections) == 2


@pytest_twisted.ensureDeferred
async def test_kept_connection_closed_after_part_of_an_answer_is_not_retried(rig: Rig) -> None:
    """Once the host has started answering it did see the request: sending it again could
    run a completion twice, so the request fails."""
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    await fetch(pool)

    def half_answer(connection: HostConnection, request: bytes) -> None:
        connection.write(b"HTTP/1.1 200")
        connection.lose()

    host.handler = half_answer
    with pytest.raises(ResponseNeverReceived):
        await guard(pool.request(H, b"POST", b"/v1/completions", b"", b"{}"))
    assert len(host.connections) == 1


@pytest_twisted.ensureDeferred
async def test_cancel_while_waiting_for_the_answer_closes_the_connection(rig: Rig) -> None:
    """The client gave up before the host answered: ``CancelledError``, and the host sees
    its connection closed (llama-server stops the work); it is not kept."""
    host, pool, connection, d = await rig.asked(b"POST", b"/v1/completions", b"", b"{}")
    d.cancel()
    with pytest.raises(CancelledError):
        await d
    await guard(connection.closed)
    host.handler = answers(OK)
    await fetch(pool)
    assert len(host.connections) == 2


@pytest_twisted.ensureDeferred
async def test_timeout_while_connecting_is_a_timeout(rig: Rig) -> None:
    """The proxy puts its header timeout on the request with ``addTimeout``, which turns a
    ``CancelledError`` into ``TimeoutError`` (a 504). Cancelled while still connecting,
    the request must fail the same way; any other error reads as "the client cancelled",
    and the proxy would leave its client without an answer."""
    clock = Clock()
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    d = pool.request(H, b"GET", b"/", b"", None)
    d.addTimeout(1.0, clock)
    clock.advance(1.0)  # before the reactor could complete the connection
    with pytest.raises(DeferredTimeout):
        await d
    await turns()
    assert all(not c.requests for c in host.connections)
    await fetch(pool)  # the pool is still usable


# -- bodies cut off, stopped, paused -------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n wo",
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello wo",
    ],
    ids=["chunked", "content-length"],
)
@pytest_twisted.ensureDeferred
async def test_body_cut_off_is_a_failure(rig: Rig, answer: bytes) -> None:
    """A body that stops short must not look complete (an SSE client would take a cut
    stream for a finished one): ``ResponseFailed``, after what did arrive."""
    _host, _pool, connection, d = await rig.asked()
    connection.write(answer)
    response = await guard(d)
    reader = read(response)
    await guard(reader.pieces.get())
    connection.lose()
    assert (await reader.ended()).check(ResponseFailed)
    assert reader.data == b"hello wo"


@pytest_twisted.ensureDeferred
async def test_stop_producing_closes_the_connection(rig: Rig) -> None:
    """The client went away: stopping the body closes the host's connection (llama-server
    stops generating), the body ends with a failure, and the connection is not reused."""
    host, pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
    response = await guard(d)
    reader = read(response)
    assert await guard(reader.pieces.get()) == b"partial"
    reader.producer.stopProducing()
    await guard(connection.closed)
    reason = await reader.ended()
    assert not reason.check(ResponseDone, PotentialDataLoss)
    host.handler = answers(OK)
    await fetch(pool)
    assert len(host.connections) == 2


class StopAtFirst(Body):
    """A reader that stops the body as soon as the first bytes come in."""

    def dataReceived(self, data: bytes) -> None:
        super().dataReceived(data)
        self.producer.stopProducing()


@pytest_twisted.ensureDeferred
async def test_stopped_body_gets_no_more_data(rig: Rig) -> None:
    """After ``stopProducing`` a reader gets nothing more, even chunks that came in the
    same read as the one it stopped at (``IPushProducer``: stop producing for good)."""
    _host, _pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    response = await guard(d)
    reader = StopAtFirst()
    response.deliverBody(reader)
    connection.write(b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n")
    await guard(connection.closed)
    reason = await reader.ended()
    assert not reason.check(ResponseDone, PotentialDataLoss)
    assert reader.data == b"one"


@pytest_twisted.ensureDeferred
async def test_stopped_body_gets_no_more_of_what_came_before_delivery(rig: Rig) -> None:
    """The same for body bytes that arrived before the reader was given the body."""
    _host, _pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    response = await guard(d)
    for piece in [b"ab", b"cd", b"ef"]:
        connection.write(piece)
        await turns(2)
    reader = StopAtFirst()
    response.deliverBody(reader)
    await guard(connection.closed)
    reason = await reader.ended()
    assert not reason.check(ResponseDone, PotentialDataLoss)
    assert len(reader.received) == 1, reader.received  # b"ab", unless two reads coalesced


@pytest_twisted.ensureDeferred
async def test_late_reader_gets_its_own_body_not_the_next_answer(rig: Rig) -> None:
    """A body that ended before its reader came stays with its answer, even once the
    connection has carried another answer."""
    host = rig.host(answers(ok(b"first"), ok(b"second")))
    pool = rig.upstreams(host.url)
    early = await guard(pool.request(H, b"GET", b"/", b"", None))
    await turns()
    _, body, _ = await fetch(pool)
    assert body.data == b"second" and len(host.connections) == 1
    late = Body()
    early.deliverBody(late)
    assert (await late.ended()).check(ResponseDone)
    assert late.data == b"first"


@pytest_twisted.ensureDeferred
async def test_stopping_a_finished_body_leaves_the_kept_connection_alone(rig: Rig) -> None:
    """``stopProducing`` after ``ResponseDone`` (a reader tidying up) must not close the
    connection that went back to the pool: the next request is answered on it."""
    host = rig.host(answers(OK, OK))
    pool = rig.upstreams(host.url)
    _, body, reason = await fetch(pool)
    assert reason.check(ResponseDone)
    body.producer.stopProducing()
    body.producer.pauseProducing()
    _, again, reason = await fetch(pool)
    assert reason.check(ResponseDone) and again.data == b"ok"
    assert len(host.connections) == 1 and host.connections[0].open


@pytest_twisted.ensureDeferred
async def test_pause_holds_the_body_until_resumed(rig: Rig) -> None:
    """A slow client pauses the host's socket: what the host sends meanwhile is not
    delivered until resume, then all of it is, and the connection is still reusable."""
    host, pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello")
    response = await guard(d)
    reader = read(response)
    assert await guard(reader.pieces.get()) == b"hello"
    reader.producer.pauseProducing()
    connection.write(b"world")
    await turns(10)
    assert reader.data == b"hello" and not reader.reasons
    reader.producer.resumeProducing()
    assert (await reader.ended()).check(ResponseDone)
    assert reader.data == b"helloworld"
    host.handler = answers(OK)
    await fetch(pool)
    assert len(host.connections) == 1


# -- the idle pool -------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_idle_connection_is_closed_after_idle_timeout(rig: Rig) -> None:
    """Closed before llama-server's own 5 s would race a request, not before."""
    clock = Clock()
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url, idle_timeout=3.0, clock=clock)
    await fetch(pool)
    first = host.connections[0]
    clock.advance(2.9)
    await turns()
    assert first.open
    clock.advance(0.2)
    await guard(first.closed)
    await fetch(pool)
    assert len(host.connections) == 2


@pytest_twisted.ensureDeferred
async def test_each_idle_connection_gets_its_full_idle_timeout(rig: Rig) -> None:
    """One idle since 0 s and one since 2 s: at 3 s only the first is closed, the second
    at 5 s."""
    clock = Clock()
    host = rig.host()
    pool = rig.upstreams(host.url, idle_timeout=3.0, clock=clock)
    d1 = pool.request(H, b"GET", b"/1", b"", None)
    d2 = pool.request(H, b"GET", b"/2", b"", None)
    (early, _), (late, _) = await host.next(), await host.next()
    early.write(OK)
    await finish(d1)
    clock.advance(2)
    late.write(OK)
    await finish(d2)
    clock.advance(1)
    await guard(early.closed)
    assert late.open
    clock.advance(1.9)
    await turns()
    assert late.open
    clock.advance(0.2)
    await guard(late.closed)


@pytest_twisted.ensureDeferred
async def test_idle_connection_past_its_time_is_not_used(rig: Rig) -> None:
    """If the pool's timer is late (a busy reactor), a connection idle for longer than
    ``idle_timeout`` is still not used: it is closed and the request gets a new one."""
    clock = Clock()
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url, idle_timeout=3.0, clock=clock)
    await fetch(pool)
    clock.rightNow = 2.5  # the clock moves on, its timers do not run
    await fetch(pool)
    assert len(host.connections) == 1  # still young: reused
    clock.rightNow = 5.6
    await fetch(pool)
    assert len(host.connections) == 2
    await guard(host.connections[0].closed)


@pytest_twisted.ensureDeferred
async def test_no_more_than_max_idle_connections_are_kept(rig: Rig) -> None:
    """Four answers finish at once with ``max_idle=3``: one connection is closed, three
    are kept and serve the next three requests."""
    host = rig.host()
    pool = rig.upstreams(host.url, max_idle=3)
    ds = [pool.request(H, b"GET", b"/%d" % i, b"", None) for i in range(4)]
    connections = [(await host.next())[0] for _ in ds]
    assert len(set(connections)) == 4
    readers = []
    for connection, d in zip(connections, ds, strict=True):
        connection.write(OK)
        reader = Body()
        (await guard(d)).deliverBody(reader)
        readers.append(reader)
    for reader in readers:
        assert (await reader.ended()).check(ResponseDone)
    await guard(DeferredList([c.closed for c in connections], fireOnOneCallback=True))
    await turns()
    assert len(host.open_connections) == 3
    host.handler = answers(OK)
    ds = [pool.request(H, b"GET", b"/", b"", None) for _ in range(3)]
    for d in ds:
        await finish(d)
    assert len(host.connections) == 4


@pytest_twisted.ensureDeferred
async def test_drop_idle_closes_idle_connections(rig: Rig) -> None:
    """``drop_idle`` fires once the idle connections are closed (closing takes the
    reactor); the next request opens a new one."""
    host = rig.host()
    pool = rig.upstreams(host.url)
    ds = [pool.request(H, b"GET", b"/", b"", None) for _ in range(2)]
    for _ in ds:
        connection, _ = await host.next()
        connection.write(OK)
    for d in ds:
        await finish(d)
    dropped = pool.drop_idle()
    assert not dropped.called
    await guard(dropped)
    for connection in host.connections:
        await guard(connection.closed)
    host.handler = answers(OK)
    await fetch(pool)
    assert len(host.connections) == 3


@pytest_twisted.ensureDeferred
async def test_drop_idle_leaves_a_streaming_answer_alone(rig: Rig) -> None:
    """Only idle connections are dropped: an answer still streaming finishes, and its
    connection is kept for the next request."""
    host, pool, connection, d = await rig.asked()
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
    reader = Body()
    (await guard(d)).deliverBody(reader)
    await guard(pool.drop_idle())
    connection.write(b"cd")
    assert (await reader.ended()).check(ResponseDone) and reader.data == b"abcd"
    host.handler = answers(OK)
    await fetch(pool)
    assert len(host.connections) == 1


@pytest_twisted.ensureDeferred
async def test_after_close_a_finished_connection_is_not_kept(rig: Rig) -> None:
    """Crossbar is stopping: an answer still coming finishes, then its connection is
    closed at once instead of waiting in the pool."""
    _host, pool, connection, d = await rig.asked()
    await guard(pool.close())
    connection.write(ok(b"last"))
    reader = Body()
    (await guard(d)).deliverBody(reader)
    assert (await reader.ended()).check(ResponseDone) and reader.data == b"last"
    await guard(connection.closed)


# -- a reload: hosts kept, re-addressed, added and dropped ---------------------------------------
async def fetch_from(pool: Upstreams, name: str) -> Body:
    _, body, reason = await finish(pool.request(name, b"GET", b"/", b"", None))
    assert reason.check(ResponseDone)
    return body


@pytest_twisted.ensureDeferred
async def test_a_host_kept_by_a_reload_keeps_its_idle_connection(rig: Rig) -> None:
    """A reload that leaves a host as it was (a new connect timeout, a host added beside
    it) does not cost it its kept-alive connection: the next request goes on it."""
    host = rig.host(answers(OK))
    other = rig.host(answers(ok(b"new")))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    pool.set_hosts({H: host.url, "gpu-b": other.url}, {H: 9.0, "gpu-b": 2.0})
    _, body, reason = await fetch(pool)
    assert body.data == b"ok" and reason.check(ResponseDone)
    assert len(host.connections) == 1
    assert len(host.connections[0].requests) == 2
    _, body, reason = await finish(pool.request("gpu-b", b"GET", b"/", b"", None))
    assert body.data == b"new" and reason.check(ResponseDone)  # the host added is asked
    assert len(other.connections) == 1


@pytest_twisted.ensureDeferred
async def test_a_re_addressed_host_closes_its_idle_connections(rig: Rig) -> None:
    """The same name at a new address: what is kept for the old one is closed, and the
    next request goes to the new address."""
    old = rig.host(answers(OK))
    new = rig.host(answers(ok(b"new")))
    pool = rig.upstreams(old.url)
    await fetch(pool)
    kept = old.connections[0]
    pool.set_hosts({H: new.url}, {H: 2.0}, fresh=[H])
    await guard(kept.closed)
    _, body, _ = await fetch(pool)
    assert body.data == b"new"
    assert len(old.connections) == 1 and len(new.connections) == 1


@pytest_twisted.ensureDeferred
async def test_a_re_addressed_host_at_the_same_url_gets_new_connections(rig: Rig) -> None:
    """``fresh`` with the URL unchanged (a new CA): the kept connection is not reused."""
    host = rig.host(answers(OK))
    pool = rig.upstreams(host.url)
    await fetch(pool)
    pool.set_hosts({H: host.url}, {H: 2.0}, fresh=[H])
    await guard(host.connections[0].closed)
    await fetch(pool)
    assert len(host.connections) == 2


@pytest_twisted.ensureDeferred
async def test_an_answer_under_way_when_its_host_moves_ends_then_its_connection_closes(
    rig: Rig,
) -> None:
    """The request in flight finishes untouched; its connection, to the old address, is
    closed when the answer ends instead of being kept."""
    old, pool, connection, d = await rig.asked()
    new = rig.host(answers(ok(b"new")))
    pool.set_hosts({H: new.url}, {H: 2.0}, fresh=[H])
    connection.write(ok(b"last"))
    _, body, reason = await finish(d)
    assert body.data == b"last" and reason.check(ResponseDone)
    await guard(connection.closed)
    _, body, _ = await fetch(pool)
    assert body.data == b"new"
    assert len(old.connections) == 1


@pytest.mark.parametrize("how", ["left out", "drop"])
@pytest_twisted.ensureDeferred
async def test_a_dropped_host_closes_its_connections(rig: Rig, how: str) -> None:
    """A host that left the config: its idle connection is closed at once, one still
    answering when its answer ends; a host that stays is untouched."""
    host = rig.host()
    other = rig.host(answers(OK))
    pool = Upstreams(rig.reactor, {H: host.url, "gpu-b": other.url}, {H: 2.0, "gpu-b": 2.0})
    rig.pools.append(pool)
    first = pool.request(H, b"GET", b"/1", b"", None)
    second = pool.request(H, b"GET", b"/2", b"", None)
    (idle, _), (busy, _) = await host.next(), await host.next()
    idle.write(OK)
    await finish(first)
    await finish(pool.request("gpu-b", b"GET", b"/", b"", None))
    if how == "drop":
        pool.drop(H)
    else:
        pool.set_hosts({"gpu-b": other.url}, {"gpu-b": 2.0})
    await guard(idle.closed)
    assert busy.open
    busy.write(ok(b"last"))
    _, body, reason = await finish(second)
    assert body.data == b"last" and reason.check(ResponseDone)
    await guard(busy.closed)
    await fetch_from(pool, "gpu-b")
    assert len(other.connections) == 1 and other.connections[0].open


@pytest_twisted.ensureDeferred
async def test_a_host_kept_while_it_finishes_still_pools_then_drop_closes(rig: Rig) -> None:
    """A host left out of the config but ``keep``: it still carries requests, so their
    connections are pooled as before, until :meth:`Upstreams.drop`."""
    host, pool, connection, d = await rig.asked()
    other = rig.host(answers(OK))
    pool.set_hosts({"gpu-b": other.url}, {"gpu-b": 2.0}, keep=[H])
    connection.write(OK)
    await finish(d)
    host.handler = answers(ok(b"again"))
    body = await fetch_from(pool, H)  # its next request goes on the kept connection
    assert body.data == b"again"
    assert len(connection.requests) == 2
    pool.drop(H)
    await guard(connection.closed)
    assert len(host.connections) == 1

"""crossbar._twisted on real loopback connections: the TCP attributes it reads still exist and
mean what they did (a Twisted release that renames one fails here, by name), and
``write_now`` puts a write on the wire at once when nothing is queued before it, and
otherwise behaves exactly like Twisted's own ``transport.write``.

The side under test is a Twisted server on loopback; its peer is a plain non-blocking
socket, so a ``recv`` right after a write shows what is already on the wire without
letting the reactor run. To read everything up to the close, the peer is handed to the
reactor (``adoptStreamConnection``).
"""

from __future__ import annotations

import select
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import ssl, tcp
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

from crossbar._twisted import (
    bytes_waiting,
    direct,
    write_now,
)
from tests.support import RecordingProducer

BLOCK = 4 * 1024 * 1024
"""More than a loopback socket takes while its peer does not read, and > SEND_LIMIT."""


Writer = Callable[[tcp.Connection, bytes], None]


def pattern(size: int) -> bytes:
    """Bytes that tell their own position (a reordering or a loss shows), without b"M"."""
    return (bytes(range(0x4D)) * (size // 0x4D + 1))[:size]


def fast(transport: tcp.Connection, data: bytes) -> None:
    write_now(direct(transport), transport, data)


def plain(transport: tcp.Connection, data: bytes) -> None:
    transport.write(data)


class Server(Protocol):
    """The side under test; tells the test when it is connected and when it is closed."""

    def __init__(self) -> None:
        self.made: Deferred[None] = Deferred()
        self.lost: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.made.callback(None)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.callback(None)


class Collector(Protocol):
    """The peer once it reads: all it got, given when the connection closes."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed.callback(bytes(self.data))


class Once(Factory):
    """A factory for exactly one, given, protocol."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol_ = protocol

    def buildProtocol(self, addr: Any) -> Protocol:
        return self.protocol_


class Pair:
    """A Twisted server connection and its peer, a plain non-blocking socket."""

    def __init__(self, reactor: Any, server: Server, peer: socket.socket) -> None:
        self.reactor = reactor
        self.server = server
        self.peer = peer
        self.collector: Collector | None = None

    @property
    def transport(self) -> tcp.Connection:
        return self.server.transport  # type: ignore[return-value]

    def on_wire(self) -> bytes:
        """What the peer can read right now, without the reactor running."""
        got = b""
        while True:
            try:
                chunk = self.peer.recv(1 << 20)
            except BlockingIOError:
                return got
            if not chunk:
                return got
            got += chunk

    async def read_to_close(self) -> bytes:
        """Let the peer read from now on; all it gets until the server's side closes."""
        self.collector = Collector()
        self.reactor.adoptStreamConnection(self.peer.fileno(), socket.AF_INET, Once(self.collector))
        self.peer.close()  # the reactor reads through its own duplicate
        return await self.collector.closed


@pytest_twisted.async_yield_fixture
async def pair(reactor: Any) -> AsyncIterator[Pair]:
    """A connected pair on loopback; both ends and the listening port are closed after."""
    server = Server()
    port = reactor.listenTCP(0, Once(server), interface="127.0.0.1")
    peer = socket.create_connection(("127.0.0.1", port.getHost().port))
    peer.setblocking(False)
    await server.made
    connection = Pair(reactor, server, peer)
    try:
        yield connection
    finally:
        peer.close()
        if not server.lost.called:
            connection.transport.abortConnection()
        await server.lost
        if connection.collector is not None:
            await connection.collector.closed
        await port.stopListening()


async def turn(reactor: Any) -> None:
    """Let the reactor run once."""
    await deferLater(reactor, 0, lambda: None)


# -- direct() ----------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_direct_is_the_tcp_connection_itself(pair: Pair) -> None:
    """A plain TCP transport can be written to directly."""
    assert isinstance(pair.transport, tcp.Connection)
    assert direct(pair.transport) is pair.transport


@pytest_twisted.ensureDeferred
async def test_direct_is_none_once_tls_is_started(pair: Pair) -> None:
    """Under TLS the socket carries ciphertext: writing plaintext to it must not happen."""
    pair.transport.startTLS(ssl.CertificateOptions())  # no handshake: the peer never speaks
    assert pair.transport.TLS
    assert direct(pair.transport) is None


# -- bytes_waiting() ----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_bytes_waiting_sees_what_the_peer_sent_before_it_is_read(pair: Pair) -> None:
    """What a just accepted connection's client has sent is seen, and left to be read."""
    connection = direct(pair.transport)
    assert not bytes_waiting(connection)
    pair.peer.send(b"GET / HTTP/1.1\r\n")
    select.select([connection.socket], [], [], 5)  # type: ignore[union-attr]
    assert bytes_waiting(connection)
    assert bytes_waiting(connection)  # only peeked at
    assert connection.socket.recv(100) == b"GET / HTTP/1.1\r\n"  # type: ignore[union-attr]


# -- an empty queue: on the wire at once --------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_with_nothing_queued_the_bytes_are_on_the_wire_at_once(pair: Pair) -> None:
    """The peer can read the write before the reactor runs again, and nothing is left queued."""
    connection = pair.transport
    write_now(direct(connection), connection, b"data: hello\n\n")
    assert pair.on_wire() == b"data: hello\n\n"
    assert not connection.dataBuffer and not connection._tempDataLen


@pytest_twisted.ensureDeferred
async def test_a_plain_write_waits_for_the_reactor(pair: Pair) -> None:
    """Twisted's own write is not readable before a reactor turn (the test above can fail)."""
    pair.transport.write(b"data: hello\n\n")
    assert pair.on_wire() == b""
    pair.transport.loseConnection()
    assert await pair.read_to_close() == b"data: hello\n\n"


# -- something queued: order and backpressure are Twisted's --------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_write_does_not_overtake_what_twisted_still_holds(pair: Pair) -> None:
    """Bytes given to transport.write but not yet sent go out before a later write_now."""
    connection = pair.transport
    block = pattern(BLOCK)
    connection.write(block)  # held by Twisted until the reactor runs; the socket is empty
    write_now(direct(connection), connection, b"MORE")
    assert pair.on_wire() == b""
    connection.loseConnection()
    got = await pair.read_to_close()
    assert got.find(b"MORE") == len(block)
    assert got == block + b"MORE"


@pytest_twisted.ensureDeferred
async def test_a_write_does_not_overtake_a_partly_sent_buffer(reactor: Any, pair: Pair) -> None:
    """Once Twisted has sent part of a block, the rest still goes out before a later write."""
    connection = pair.transport
    block = pattern(BLOCK)
    connection.write(block)
    for _ in range(100):  # until the reactor has sent the first slice
        if not connection._tempDataLen:
            break
        await turn(reactor)
    head = pair.on_wire()  # the peer reads what was sent, so the socket has room again
    assert head and connection.dataBuffer
    assert select.select([], [connection.socket], [], 0)[1], "socket full: test could not fail"
    write_now(direct(connection), connection, b"MORE")
    connection.loseConnection()
    got = head + await pair.read_to_close()
    assert got.find(b"MORE") == len(block)
    assert got == block + b"MORE"


@pytest_twisted.ensureDeferred
async def test_what_the_socket_does_not_take_is_queued_and_pauses_the_producer(
    pair: Pair,
) -> None:
    """A write larger than the socket takes sends a part, queues the rest and pauses the
    streaming producer, as Twisted's write does; all of it arrives, then it is resumed."""
    connection = pair.transport
    producer = RecordingProducer()
    connection.registerProducer(producer, True)
    block = pattern(BLOCK)
    write_now(direct(connection), connection, block)
    head = pair.on_wire()
    assert 0 < len(head) < BLOCK  # a part went out at once
    assert connection._tempDataLen == BLOCK - len(head)  # the rest waits in the transport
    assert producer.calls == ["pause"]
    connection.unregisterProducer()
    connection.loseConnection()
    assert head + await pair.read_to_close() == block


# -- closing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("write", [fast, plain], ids=["write_now", "transport.write"])
@pytest_twisted.ensureDeferred
async def test_after_lose_connection_a_write_is_left_to_twisted(pair: Pair, write: Writer) -> None:
    """After loseConnection nothing is sent directly; the peer gets what Twisted's own write
    gives it (the bytes, sent before the close)."""
    pair.transport.loseConnection()
    write(pair.transport, b"late")
    assert pair.on_wire() == b""
    assert await pair.read_to_close() == b"late"


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(fast, id="write_now"),
        pytest.param(plain, id="transport.write"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_after_abort_connection_nothing_more_is_sent(pair: Pair, write: Writer) -> None:
    """An aborted connection sends nothing more: a cut-off stream must not gain bytes (such as
    a final chunk that makes it look complete) before the reset."""
    pair.transport.abortConnection()
    write(pair.transport, b"0\r\n\r\n")
    assert pair.on_wire() == b""


# -- the private attributes, by name ---------------------------------------------------------


@pytest.mark.parametrize("name", ["_tempDataLen", "_writeDisconnected", "_aborting"])
@pytest_twisted.ensureDeferred
async def test_a_tcp_connection_still_has(pair: Pair, name: str) -> None:
    transport = pair.server.transport
    assert hasattr(transport, name), f"twisted.internet.tcp.Connection has no {name} any more"


@pytest_twisted.ensureDeferred
async def test_aborting_is_what_abort_connection_sets(pair: Pair) -> None:
    transport: Any = pair.server.transport
    assert not transport._aborting
    transport.abortConnection()
    assert transport._aborting
    await pair.server.lost

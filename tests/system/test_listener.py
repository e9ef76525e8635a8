"""crossbar.http.listener on real loopback ports (binding is the point): the service that
opens crossbar's port, and the endpoint that lets worker processes share one
(``SO_REUSEPORT``).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.error import CannotListenError, ConnectionRefusedError
from twisted.internet.interfaces import IListeningPort, IReactorTCP
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from crossbar.http.listener import (
    CannotListen,
    Listener,
    ReusePortEndpoint,
)
from tests.support.greeter import Greeter


class Hear(Protocol):
    """Everything the server said, once it hung up."""

    def __init__(self) -> None:
        self.heard: Deferred[bytes] = Deferred()
        self._data = b""

    def dataReceived(self, data: bytes) -> None:
        self._data += data

    def connectionLost(self, reason: Failure = Failure(Exception())) -> None:  # noqa: B008
        self.heard.callback(self._data)


async def greeting(reactor: IReactorTCP, port: int, host: str = "127.0.0.1") -> bytes:
    hear = Hear()
    await connectProtocol(TCP4ClientEndpoint(reactor, host, port, timeout=5), hear)
    return await hear.heard


async def close(port: IListeningPort) -> None:
    stopped = port.stopListening()
    if stopped is not None:
        await stopped


def number(port: IListeningPort) -> int:
    return int(port.getHost().port)  # type: ignore[attr-defined]


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port held by a plain listening socket (no SO_REUSEPORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


# -- Listener ---------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_listener_fires_listening_with_the_port_and_stops_listening(
    reactor: IReactorTCP,
) -> None:
    listener = Listener(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"), Greeter(b"hi"))
    listener.startService()
    port = await listener.listening
    assert listener.running
    assert listener.port is port
    at = number(port)
    assert await greeting(reactor, at) == b"hi"

    stopped = listener.stopService()
    assert stopped is not None
    await stopped
    assert not listener.running
    assert listener.port is None
    with pytest.raises(ConnectionRefusedError):
        await greeting(reactor, at)


def test_a_port_in_use_raises_from_start_service(reactor: IReactorTCP, taken: int) -> None:
    """twistd then stops, instead of running a crossbar that nobody can reach."""
    endpoint = TCP4ServerEndpoint(reactor, taken, interface="127.0.0.1")
    listener = Listener(endpoint, Greeter(b"x"), name=f"tcp:{taken}")
    with pytest.raises(CannotListen) as raised:
        listener.startService()
    assert str(raised.value) == f"cannot listen on tcp:{taken}: address already in use"
    assert not listener.running
    assert listener.port is None
    assert not listener.listening.called


# -- ReusePortEndpoint ------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_two_listeners_share_one_port(reactor: IReactorTCP) -> None:
    first = await ReusePortEndpoint(reactor, "tcp:0:interface=127.0.0.1").listen(Greeter(b"1"))
    shared = number(first)
    second = await ReusePortEndpoint(reactor, f"tcp:{shared}:interface=127.0.0.1").listen(
        Greeter(b"2")
    )
    try:
        assert number(second) == shared
        # The kernel spreads connections over both (by their addresses).
        heard = set()
        for _ in range(32):
            heard.add(await greeting(reactor, shared))
            if len(heard) == 2:
                break
        assert heard == {b"1", b"2"}
        # A socket without SO_REUSEPORT still cannot take the port.
        with pytest.raises(CannotListenError):
            reactor.listenTCP(shared, Greeter(b"3"), interface="127.0.0.1")
        await close(first)
        # The other keeps serving the port alone.
        assert {await greeting(reactor, shared) for _ in range(8)} == {b"2"}
    finally:
        for port in (first, second):
            if port.connected:  # type: ignore[attr-defined]
                await close(port)


@pytest.mark.parametrize("where", ["in use without SO_REUSEPORT", "not an address of this host"])
def test_a_port_that_cannot_be_bound_is_a_failed_deferred(
    reactor: IReactorTCP, taken: int, where: str
) -> None:
    listen = (
        f"tcp:{taken}:interface=127.0.0.1"
        if where.startswith("in use")
        else "tcp:0:interface=192.0.2.1"  # TEST-NET-1: never assigned to a host
    )
    failures: list[Failure] = []
    ReusePortEndpoint(reactor, listen).listen(Greeter(b"x")).addErrback(failures.append)
    assert len(failures) == 1
    assert failures[0].check(OSError)


@pytest_twisted.ensureDeferred
async def test_an_ipv6_interface_can_be_shared(reactor: IReactorTCP) -> None:
    port = await ReusePortEndpoint(reactor, r"tcp:0:interface=\:\:1").listen(Greeter(b"6"))
    try:
        assert port.getHost().host == "::1"  # type: ignore[attr-defined]
    finally:
        await close(port)

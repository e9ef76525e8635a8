"""crossbar's proxy in memory: no sockets, no real time, every byte played by the test.

As ``treq.testing`` runs treq against a resource in memory, :class:`MemoryProxy` runs
crossbar's own site, exchange and upstream client on a ``MemoryReactorClock``. A client is
a ``StringTransport`` (:class:`ClientLine`); each connection crossbar opens to a host waits
until the test accepts or refuses it, and the host's side (:class:`HostLine`) sends what
the test says, byte by byte. Failover, a kept-alive connection the host closed, a client
that leaves in any phase, timeouts on the clock: all without the reactor. A connection
closed by either side reaches the other on the clock's next turn (``clock.advance(0)``),
as a socket's close does. Tests where the
timing of real bytes is the point use real sockets (:mod:`crossbar.testing.rig`).
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet import error
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from crossbar.config import Config
from crossbar.http import Channel, Site
from crossbar.polling import HealthTable
from crossbar.prefixes import PrefixKeeper
from crossbar.proxy import PlacementsTold, ProxyContext, ProxyResource, RootResource
from crossbar.queueing import Traffic, Waits
from crossbar.stats import RequestRecord
from crossbar.upstream import Upstreams

CLIENT = IPv4Address("TCP", "127.0.0.1", 40000)


class LineTransport(StringTransport):
    """A StringTransport whose close reaches its protocol on the clock's next turn, as
    a socket's does (``connectionLost`` after ``loseConnection`` or ``abortConnection``);
    ``writes`` keeps each write apart, to see how many a message took."""

    def __init__(self, clock: MemoryReactorClock, peer: IPv4Address | None = None) -> None:
        super().__init__(peerAddress=peer)
        self._clock = clock
        self.protocol: Any = None
        self.writes: list[bytes] = []
        self._lost = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        super().write(data)

    def loseConnection(self) -> None:
        super().loseConnection()
        self._lose(error.ConnectionDone())

    def abortConnection(self) -> None:
        super().abortConnection()
        self._lose(error.ConnectionAborted())

    def _lose(self, why: Exception) -> None:
        if not self._lost:
            self._lost = True
            self._clock.callLater(0, self.protocol.connectionLost, Failure(why))


@attrs.define
class HostLine:
    """A connection crossbar opened to a host, seen from the host."""

    host: str
    """The host's name in the config."""
    protocol: Any
    transport: LineTransport

    @property
    def received(self) -> bytes:
        """What crossbar sent on it so far."""
        sent: bytes = self.transport.value()
        return sent

    def send(self, data: bytes) -> None:
        """The host sends ``data`` (a head, a chunk, anything)."""
        self.protocol.dataReceived(data)

    def close(self) -> None:
        """The host closes the connection."""
        self.transport.loseConnection()

    @property
    def closed(self) -> bool:
        """crossbar closed (or aborted) it."""
        return bool(self.transport.disconnecting)

    @property
    def paused(self) -> bool:
        """crossbar stopped reading it (its client is slow)."""
        return self.transport.producerState == "paused"


@attrs.define
class ClientLine:
    """A client's connection to crossbar."""

    channel: Channel
    transport: LineTransport

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    @property
    def received(self) -> bytes:
        """What crossbar answered on it so far."""
        answered: bytes = self.transport.value()
        return answered

    def leave(self) -> None:
        """The client goes away."""
        self.transport.abortConnection()

    def stop_reading(self) -> None:
        """The client reads nothing more: its socket's buffer is full."""
        self.channel.pauseProducing()

    def read_again(self) -> None:
        self.channel.resumeProducing()

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


class MemoryProxy:
    """crossbar's proxy for ``config``, in memory, with every host healthy and listing
    ``models`` (loaded). ``records`` are the requests that ended, as the access log,
    metrics and recent window get them. ``prefixes`` saves and restores shared prefixes."""

    def __init__(
        self,
        config: Config,
        models: tuple[str, ...] = (),
        prefixes: PrefixKeeper | None = None,
        placements: PlacementsTold | None = None,
    ) -> None:
        self.clock = MemoryReactorClock()
        self.config = config
        self.table = HealthTable(config.urls, self.clock, config.settings)
        for name in config.hosts:
            self.table.record_ok(name, models, models)
        slots = {n: h.slots for n, h in config.hosts.items() if h.slots is not None}
        self.traffic = Traffic(config.hosts, config.routes, slots)
        timeouts = {name: s.connect_timeout for name, s in config.settings.items()}
        self.upstreams = Upstreams(self.clock, config.urls, timeouts, clock=self.clock)
        self.records: list[RequestRecord] = []
        self.waits = Waits(self.traffic, self.table, self.clock)
        self.waits.configure(config)
        context = ProxyContext(
            config, self.table, self.traffic, self.upstreams, self.clock, self, self.waits,
            prefixes=prefixes, placements=placements,
        )  # fmt: skip
        proxy = ProxyResource(context)
        self.site = Site(
            RootResource(proxy), proxy=proxy, limits=config.limits, reactor=self.clock,
            observer=self, timeout=None,
        )  # fmt: skip
        self._hosts = {_address(url): name for name, url in config.urls.items()}
        self._accepted = 0

    def request_done(self, record: RequestRecord) -> None:
        self.records.append(record)

    def client(self) -> ClientLine:
        """A new client connection."""
        channel = self.site.buildProtocol(CLIENT)
        transport = LineTransport(self.clock, CLIENT)
        transport.protocol = channel
        channel.makeConnection(transport)
        return ClientLine(channel, transport)

    @property
    def waiting(self) -> list[str]:
        """The hosts crossbar is connecting to, oldest first (not yet accepted or refused)."""
        pending = self.clock.tcpClients[self._accepted :]
        return [self._hosts[host, port] for host, port, *_ in pending]

    def accept(self) -> HostLine:
        """The oldest connection attempt succeeds."""
        host, port, factory, *_ = self._next()
        protocol = factory.buildProtocol(IPv4Address("TCP", host, port))
        transport = LineTransport(self.clock, IPv4Address("TCP", host, port))
        transport.protocol = protocol
        protocol.makeConnection(transport)
        return HostLine(self._hosts[host, port], protocol, transport)

    def refuse(self, reason: Exception | None = None) -> str:
        """The oldest connection attempt fails (refused, or ``reason``); its host."""
        host, port, factory, *_ = self._next()
        connector = self.clock.connectors[self._accepted - 1]
        factory.clientConnectionFailed(connector, Failure(reason or error.ConnectionRefusedError()))
        return self._hosts[host, port]

    def _next(self) -> tuple[Any, ...]:
        assert len(self.clock.tcpClients) > self._accepted, "crossbar is connecting nowhere"
        self._accepted += 1
        return self.clock.tcpClients[self._accepted - 1]  # type: ignore[no-any-return]


def _address(url: str) -> tuple[str, int]:
    """``http://127.0.0.1:8081`` -> ``("127.0.0.1", 8081)``: a memory host's address."""
    rest = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return host, int(port)

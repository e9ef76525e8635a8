"""Wire config -> health table -> proxy into one Twisted service.

Data flows one way: the config names the hosts, the poller fills the health table,
the proxy reads the table to choose a host, and the status pages only read.
"""

from __future__ import annotations

from typing import Any

from treq.client import HTTPClient
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, _HTTP11ClientFactory

from crossbar.config import Config
from crossbar.health import HealthTable, Poller, log_transition
from crossbar.metrics import Metrics
from crossbar.proxy import ProxyResource, RootResource, Site
from crossbar.status import StatusApp

IDLE_POOL_TIMEOUT = 3.0
"""Seconds an idle upstream connection is kept: llama-server drops them after 5 s,
and a POST sent on a connection the server is closing would fail."""

CLIENT_IDLE_TIMEOUT = 75.0
"""Seconds an idle client connection is kept open."""


class Listener(Service):
    """Listens on an endpoint; ``listening`` fires with the port once it is open.

    A port that cannot be opened (in use, no permission) is raised from
    ``startService`` so that twistd stops instead of running deaf.
    """

    def __init__(self, endpoint: IStreamServerEndpoint, factory: Site) -> None:
        self._endpoint = endpoint
        self._factory = factory
        self.port: IListeningPort | None = None
        self.listening: Deferred[IListeningPort] = Deferred()

    def startService(self) -> None:
        super().startService()
        d = self._endpoint.listen(self._factory)
        failures: list[Failure] = []
        d.addCallbacks(self._listened, failures.append)
        if failures:
            self.running = False
            failures[0].raiseException()

    def _listened(self, port: IListeningPort) -> None:
        self.port = port
        self.listening.callback(port)

    def stopService(self) -> Deferred[Any] | None:
        super().stopService()
        port, self.port = self.port, None
        return port.stopListening() if port is not None else None


class _ClosePools(Service):
    """Drops kept-alive upstream connections when crossbar stops."""

    def __init__(self, *pools: HTTPConnectionPool) -> None:
        self._pools = pools

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        return DeferredList([pool.closeCachedConnections() for pool in self._pools])


class _QuietClientFactory(_HTTP11ClientFactory):
    noisy = False


class _QuietPool(HTTPConnectionPool):
    """A pool that does not log two lines for every upstream connection."""

    _factory = _QuietClientFactory


def make_pool(reactor: Any, per_host: int) -> HTTPConnectionPool:
    pool = _QuietPool(reactor, persistent=True)
    pool.maxPersistentPerHost = per_host
    pool.cachedConnectionTimeout = IDLE_POOL_TIMEOUT  # type: ignore[assignment]
    return pool


class Crossbar(MultiService):
    """The running crossbar: poller, proxy, status pages and listener. Tests build it directly."""

    def __init__(self, config: Config, reactor: Any) -> None:
        super().__init__()
        self.config = config
        settings = {name: config.settings(name) for name in config.hosts}
        self.table = HealthTable({n: h.url for n, h in config.hosts.items()}, reactor, settings)
        self.table.on_change(log_transition)

        poll_pool = make_pool(reactor, per_host=1)
        poll_client = HTTPClient(Agent(reactor, pool=poll_pool))
        self.poller = Poller(self.table, poll_client, reactor, settings)
        proxy_pool = make_pool(reactor, per_host=64)
        agent = Agent(reactor, pool=proxy_pool, connectTimeout=5.0)
        self.proxy = ProxyResource(config, self.table, agent, reactor)
        self.metrics = Metrics(self.table, self.proxy)
        self.proxy.observer = self.metrics
        self.status = StatusApp(config, self.table, self.proxy, self.metrics, reactor)

        root = RootResource(self.proxy)
        root.putChild(b"_crossbar", self.status.resource())
        self.site = Site(root, timeout=CLIENT_IDLE_TIMEOUT)

        _ClosePools(poll_pool, proxy_pool).setServiceParent(self)
        self.poller.setServiceParent(self)
        self.listener = Listener(serverFromString(reactor, config.listen), self.site)
        self.listener.setServiceParent(self)

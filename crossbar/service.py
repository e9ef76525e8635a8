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
from twisted.web.client import HTTPConnectionPool

from crossbar.config import Config
from crossbar.connect import make_agent, make_pool
from crossbar.health import HealthTable, Poller, log_transition
from crossbar.metrics import Metrics
from crossbar.proxy import ProxyResource, RootResource, Site
from crossbar.status import StatusApp

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


class Crossbar(MultiService):
    """The running crossbar: poller, proxy, status pages and listener. Tests build it directly."""

    def __init__(self, config: Config, reactor: Any) -> None:
        super().__init__()
        self.config = config
        settings = {name: config.settings(name) for name in config.hosts}
        self.table = HealthTable({n: h.url for n, h in config.hosts.items()}, reactor, settings)
        self.table.on_change(log_transition)

        urls = {name: host.url for name, host in config.hosts.items()}
        poll_pool = make_pool(reactor, per_host=1)
        poll_timeouts = {name: s.poll_timeout for name, s in settings.items()}
        poll_client = HTTPClient(make_agent(reactor, poll_pool, urls, poll_timeouts))
        self.poller = Poller(self.table, poll_client, reactor, settings)
        proxy_pool = make_pool(reactor, per_host=64)
        connect_timeouts = {name: s.connect_timeout for name, s in settings.items()}
        agent = make_agent(reactor, proxy_pool, urls, connect_timeouts)
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

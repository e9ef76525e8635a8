"""Wire config -> health table -> proxy into one Twisted service.

Data flows one way: the config names the hosts, the poller fills the health table,
the proxy reads the table to choose a host, and the status pages only read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.endpoints import TCP4ServerEndpoint, serverFromString
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import IResource, Resource

from crossbar.config import Config
from crossbar.connect import make_agent, make_pool
from crossbar.health import HealthTable, Poller, log_transition
from crossbar.metrics import Metrics, merge_workers
from crossbar.proxy import ProxyResource, RootResource, Site
from crossbar.status import StatusApp
from crossbar.upstream import Upstreams
from crossbar.workers import ReusePortEndpoint, WorkerInfo, peer_ports

log = Logger()

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

    def __init__(self, polls: HTTPConnectionPool, upstreams: Upstreams) -> None:
        self._polls = polls
        self._upstreams = upstreams

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        return DeferredList([self._polls.closeCachedConnections(), self._upstreams.close()])


class Crossbar(MultiService):
    """The running crossbar: poller, proxy, status pages and listener. Tests build it directly."""

    def __init__(self, config: Config, reactor: Any, worker: WorkerInfo | None = None) -> None:
        super().__init__()
        self.config = config
        self.worker = worker
        settings = {name: config.settings(name) for name in config.hosts}
        self.table = HealthTable({n: h.url for n, h in config.hosts.items()}, reactor, settings)
        self.table.on_change(log_transition)

        urls = {name: host.url for name, host in config.hosts.items()}
        poll_pool = make_pool(reactor, per_host=1)
        poll_timeouts = {name: s.poll_timeout for name, s in settings.items()}
        poll_client = self._client = HTTPClient(make_agent(reactor, poll_pool, urls, poll_timeouts))
        self.poller = Poller(self.table, poll_client, reactor, settings)
        connect_timeouts = {name: s.connect_timeout for name, s in settings.items()}
        upstreams = Upstreams(reactor, urls, connect_timeouts, max_idle=64)
        self.proxy = ProxyResource(config, self.table, upstreams, reactor)
        self.metrics = Metrics(self.table, self.proxy)
        self.proxy.observer = self.metrics
        self.status = StatusApp(config, self.table, self.proxy, self.metrics, reactor)

        root = RootResource(self.proxy)
        status_root = self.status.resource()
        root.putChild(b"_crossbar", status_root)
        self.site = Site(root, timeout=CLIENT_IDLE_TIMEOUT, parsePOSTFormSubmission=False)

        _ClosePools(poll_pool, upstreams).setServiceParent(self)
        self.poller.setServiceParent(self)
        if worker is None:
            endpoint = serverFromString(reactor, config.listen)
        else:
            endpoint = ReusePortEndpoint(reactor, config.listen)
            self._serve_peers(reactor, worker, status_root)
        self.listener = Listener(endpoint, self.site)
        self.listener.setServiceParent(self)

    def _serve_peers(self, reactor: Any, worker: WorkerInfo, status: IResource) -> None:
        """A private loopback port for the other workers, and metrics from all of them."""
        admin = Resource()
        admin.putChild(b"_crossbar", status)
        private = Listener(
            TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"),
            Site(admin, timeout=30, parsePOSTFormSubmission=False),
        )
        private.setServiceParent(self)
        private.listening.addCallback(_write_port, worker.port_file(worker.index))
        self.status.gather_metrics = lambda: Deferred.fromCoroutine(self._all_metrics(worker))

    async def _all_metrics(self, worker: WorkerInfo) -> bytes:
        texts = {str(worker.index): self.metrics.render()}
        for index, port in peer_ports(worker).items():
            url = f"http://127.0.0.1:{port}/_crossbar/metrics?local=1"
            try:
                response = await self._client.get(url, timeout=2.0)
                texts[str(index)] = await response.content()
            except Exception as e:
                log.warn("metrics of worker {index} unavailable: {e}", index=index, e=e)
        return merge_workers(texts)


def _write_port(port: IListeningPort, path: Path) -> None:
    """Publish a worker's private port for its peers (atomically: never half a number)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(str(port.getHost().port))  # type: ignore[attr-defined]
    scratch.replace(path)

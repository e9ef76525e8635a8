"""The composition root: config -> health table -> proxy, pages and listeners, wired
once, in one place, into one Twisted service.

Data flows one way: the config names the hosts, the poller fills the health table,
the proxy reads the table to choose a host and reports each request to the metrics,
and the status pages only read.
"""

from __future__ import annotations

from socket import gethostname
from typing import Any

from treq.client import HTTPClient
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, gatherResults
from twisted.internet.endpoints import TCP4ServerEndpoint, serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource

from crossbar import __version__
from crossbar._twisted import handling_request
from crossbar.config import DEMO_SOURCE, LISTEN_BACKLOG, Config, tcp_address
from crossbar.fleet import HealthTable, HostState, Observers, Traffic
from crossbar.fleet.poller import Poller
from crossbar.fleet.recent import RecentTraffic
from crossbar.pages.app import StatusApp
from crossbar.pages.metrics import Metrics
from crossbar.pages.peers import WorkerInfo, gather_metrics, publish_port
from crossbar.server.context import ProxyContext
from crossbar.server.door import Guard, RawHeaders, Refusal
from crossbar.server.keys import KeyGuard, Pages
from crossbar.server.listening import Listener, ReusePortEndpoint
from crossbar.server.resources import ProxyResource, RootResource
from crossbar.server.site import Site
from crossbar.upstream import Upstreams
from crossbar.upstream.endpoints import make_agent, make_pool

log = Logger()

CLIENT_IDLE_TIMEOUT = 75.0
"""Seconds an idle client connection is kept open."""
MAX_IDLE_PER_HOST = 64
"""Idle upstream connections kept per host for the proxy."""
DRAIN_CHECK = 0.1
"""Seconds between two looks at the requests still in flight while crossbar stops."""
SHUTTING_DOWN = Refusal(503, "shutting down", ((b"Retry-After", b"1"),), close=True)


def log_transition(old: HostState, new: HostState) -> None:
    """One log line when a host changes state, not one per poll."""
    if new.healthy:
        log.info("host {name} is up", name=new.name, host_state="up")
    else:
        log.warn(
            "host {name} is down: {reason}", name=new.name, reason=new.last_err, host_state="down"
        )


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
        settings = config.settings
        self.table = HealthTable(config.urls, reactor, settings)
        self.table.on_change(log_transition)
        slots = {name: h.slots for name, h in config.hosts.items() if h.slots is not None}
        self.traffic = Traffic(config.hosts, config.routes, slots)

        poll_pool = make_pool(reactor, per_host=1)
        poll_timeouts = {name: s.poll_timeout for name, s in settings.items()}
        tls_cas = {name: h.tls_ca for name, h in config.hosts.items() if h.tls_ca}
        host_keys = {name: h.api_key for name, h in config.hosts.items() if h.api_key}
        poll_agent = make_agent(reactor, poll_pool, config.urls, poll_timeouts, tls_cas=tls_cas)
        self._client = HTTPClient(poll_agent)
        self.poller = Poller(self.table, self._client, reactor, keys=host_keys)
        connect_timeouts = {name: s.connect_timeout for name, s in settings.items()}
        upstreams = Upstreams(
            reactor, config.urls, connect_timeouts, max_idle=MAX_IDLE_PER_HOST, tls_cas=tls_cas
        )
        self.metrics = Metrics(self.table, self.traffic)
        affine = [name for name, r in config.routes.items() if r.policy == "cache_affinity"]
        self.recent = RecentTraffic(config.hosts, reactor, affine)
        observer = Observers(self.metrics, self.recent)
        self.proxy = ProxyResource(
            ProxyContext(config, self.table, self.traffic, upstreams, reactor, observer)
        )
        self.status = StatusApp(
            config,
            self.table,
            self.traffic,
            self.metrics,
            reactor,
            gather_metrics=None if worker is None else lambda: self._all_metrics(worker),
            recent=self.recent,
            worker=worker,
        )

        root = RootResource(self.proxy)
        status_root = self.status.resource()
        own_pages = config.status_listen is not None
        root.putChild(b"_crossbar", self.status.probes() if own_pages else status_root)
        self.site = Site(
            root,
            proxy=self.proxy,
            guard=_guard(config, "probes" if own_pages else "all"),
            limits=config.limits,
            timeout=CLIENT_IDLE_TIMEOUT,
            parsePOSTFormSubmission=False,
        )
        self.metrics.count_connections(self.site)

        _ClosePools(poll_pool, upstreams).setServiceParent(self)
        self.poller.setServiceParent(self)
        if worker is None:
            endpoint = serverFromString(reactor, config.listen)
        else:
            endpoint = ReusePortEndpoint(reactor, config.listen)
            # A private loopback port where the other workers ask for this one's metrics.
            admin = Resource()
            admin.putChild(b"_crossbar", status_root)
            # Guarded like the pages: any local user can reach a loopback port.
            private = Listener(
                TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"),
                Site(
                    admin,
                    internal=True,
                    guard=_guard(config, "only"),
                    timeout=30,
                    parsePOSTFormSubmission=False,
                ),
            )
            private.setServiceParent(self)
            private.listening.addCallback(publish_port, worker.port_file(worker.index))
        self.status_listener: Listener | None = None
        self._reactor = reactor
        self._sites = [self.site]
        if config.status_listen is not None:
            # Started before the main port, so that the announcement knows both.
            pages_site = Site(
                self.status.own_root(),
                internal=True,  # announced with the routes, not as a second crossbar
                guard=_guard(config, "only"),
                limits=config.limits,
                timeout=CLIENT_IDLE_TIMEOUT,
                parsePOSTFormSubmission=False,
            )
            self._sites.append(pages_site)
            self.status_listener = Listener(
                serverFromString(reactor, config.status_listen)
                if worker is None
                else ReusePortEndpoint(reactor, config.status_listen),
                pages_site,
                name=shown_listen(config.status_listen),
            )
            self.status_listener.setServiceParent(self)
        self.listener = Listener(endpoint, self.site, name=shown_listen(config.listen))
        self.listener.setServiceParent(self)
        if worker is None or worker.index == 0:
            self.listener.listening.addCallback(self._announce)

    def stopService(self) -> Deferred[Any]:
        """Drain, then stop the poller, the pools and the listeners."""

        async def stop() -> None:
            await self.drain()
            await MultiService.stopService(self)

        return Deferred.fromCoroutine(stop())

    async def drain(self) -> None:
        """Stop taking requests and let those in flight finish, for up to ``drain_timeout``.

        The ports close at once and readyz says 503, so a balancer sends elsewhere. A
        connection is closed as soon as it is between requests (an idle kept-alive one at
        once, a busy one after its answer): its client reconnects to another crossbar
        rather than finding this one gone mid-request. A request whose head still comes
        in on an open connection is answered 503. Past the timeout, the connections left
        are cut, which cancels their requests on the hosts.
        """
        if self.status.draining:
            return
        self.status.draining = True
        for site in self._sites:
            site.guard = _shutting_down(site.guard)
        closing = [d for d in (self.listener.close(), self._status_close()) if d is not None]
        timeout = self.config.drain_timeout
        waiting = busy = self._close_idle()
        if busy:
            log.info(
                "stopping: waiting up to {timeout}s for {count}",
                timeout=f"{timeout:g}",
                count=_requests(busy, "in flight"),
            )
        else:
            log.info("stopping: no request in flight")
        deadline = self._reactor.seconds() + timeout
        while busy and self._reactor.seconds() < deadline:
            await deferLater(self._reactor, min(DRAIN_CHECK, timeout), lambda: None)
            busy = self._close_idle()
        cut = 0
        for site in self._sites:
            for channel in list(site.channels):
                if handling_request(channel):  # the idle ones are closing already
                    cut += 1
                    transport: Any = channel.transport
                    transport.abortConnection()
        if waiting:
            finished = max(waiting - cut, 0)
            words = [_requests(finished, "finished")] if finished or not cut else []
            if cut:
                words.append(f"{_requests(cut, 'cut off')} after {timeout:g}s")
            log.info("stopped: {outcome}", outcome=", ".join(words))
        await gatherResults(closing)

    def _status_close(self) -> Deferred[None] | None:
        return None if self.status_listener is None else self.status_listener.close()

    def _close_idle(self) -> int:
        """Close the client connections that are between requests; count the others,
        whose answers end their connection."""
        busy = 0
        for site in self._sites:
            for channel in list(site.channels):
                if handling_request(channel):
                    channel.persistent = False
                    busy += 1
                else:
                    transport: Any = channel.transport
                    transport.loseConnection()
        return busy

    def _announce(self, port: IListeningPort) -> None:
        """Say what this crossbar serves, with the base URLs to paste into an agent."""
        pages = self.status_listener.port if self.status_listener is not None else None
        lines = announcement(self.config, _port(port), gethostname(), _port(pages))
        for line in lines:
            log.info("{line}", line=line)

    def _all_metrics(self, worker: WorkerInfo) -> Deferred[bytes]:
        keys = self.config.status_keys
        own = self.metrics.render()
        return Deferred.fromCoroutine(
            gather_metrics(worker, own, self._client, keys[0] if keys else None)
        )


def _shutting_down(guard: Guard | None) -> Guard:
    """``guard`` for the pages (readyz says the drain); 503 for anything else."""

    def check(path: bytes, headers: RawHeaders) -> Refusal | None:
        if not path.startswith(b"/_crossbar/"):
            return SHUTTING_DOWN
        return None if guard is None else guard(path, headers)

    return check


def _requests(count: int, what: str) -> str:
    """``1 request finished``, ``3 requests in flight``."""
    return f"{count} request{'' if count == 1 else 's'} {what}"


def _guard(config: Config, pages: Pages) -> KeyGuard | None:
    """The keys of a listener, or ``None`` where there are none to ask for."""
    guard = KeyGuard.for_config(config, pages)
    return guard if guard.needed else None


def _port(port: IListeningPort | None) -> int | None:
    return None if port is None else getattr(port.getHost(), "port", None)


def shown_listen(listen: str) -> str:
    """The listen endpoint as an admin wrote it: without the backlog crossbar adds."""
    return listen.replace(f":backlog={LISTEN_BACKLOG}", "")


def announcement(
    config: Config, port: int | None, hostname: str, status_port: int | None = None
) -> list[str]:
    """Start-up lines: where crossbar listens, each route's base URL for agents (and
    whether it wants a key: never which), and where the status pages are."""
    lines = [f"crossbar {__version__} listening on {shown_listen(config.listen)}"]
    if config.source == DEMO_SOURCE:
        lines.append("the fleet is simulated (--demo): no GPU, answers are made up")
    base = _base_url(config.listen, port, hostname)
    for name, route in config.routes.items():
        model = route.default_model or "none"
        key = "; a key is required" if route.api_keys else ""
        lines.append(
            f"route {name}: {base}/{name}/v1 -> hosts {', '.join(route.hosts)}; "
            f"policy {route.policy}; default model {model}{key}"
        )
    pages = f"{base}/_crossbar/"
    if config.status_listen is not None:
        pages = _base_url(config.status_listen, status_port, hostname) + "/_crossbar/"
        pages += " (the main port serves only /_crossbar/livez and /_crossbar/readyz)"
    if config.status_keys:
        pages += "; a status key is required (Authorization: Bearer <key>)"
    lines.append(f"status pages: {pages}")
    return lines


def _base_url(listen: str, port: int | None, hostname: str) -> str:
    """``http://<where>:<port>`` of a listener, or its endpoint as written when it has
    no TCP port (a UNIX socket)."""
    if port is None:
        return shown_listen(listen)
    try:
        interface = tcp_address(listen)[0]
    except ValueError:  # not a plain tcp: endpoint
        interface = ""
    where = interface if interface not in ("", "0.0.0.0", "::") else hostname
    return f"http://{where}:{port}"

"""The composition root: config -> hosts -> proxy, pages and front door, wired once, in
one place, into one Twisted service.

Data flows one way: the config names the hosts, the poller fills the health table, the
proxy reads the table to choose a host and hands each request's record to its observers
(metrics, the recent and hourly windows, the access log, the usage ledger), and the status
pages read all of it. The one thing the pages change is the config: ``POST /_crossbar/reload`` calls
:meth:`Crossbar.reload_everywhere`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from socket import gethostname
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger

from crossbar import __version__
from crossbar.config import (
    DEMO_SOURCE,
    MEMORY_DB,
    Changes,
    Config,
    ConfigError,
    HostSettings,
    Reloaded,
    Reloads,
    compare,
    shown_listen,
    tcp_address,
)
from crossbar.hosts import Hosts
from crossbar.http import KeyGuard, count_requests
from crossbar.pages import (
    StatusApp,
    WorkerInfo,
    gather_metrics,
    peer_secret,
    publish_port,
    read_port,
)
from crossbar.polling import HealthTable
from crossbar.prefixes import PrefixCounts, PrefixKeeper, PrefixSaves
from crossbar.proxy import ProxyContext, ProxyResource
from crossbar.queueing import Traffic, Waits
from crossbar.routing import CacheAffinity
from crossbar.sharing import Member, PlacementSync, joining, keeping, storing
from crossbar.sites import PageResources, Private, Sites
from crossbar.stats import AccessLog, Metrics, Observers
from crossbar.upstream import describe
from crossbar.usage import OneThread, UsageLedger, UsageQueries, UsageStore

log = Logger()

SLOTS_PORT_FILE = "slots.port"
"""Where worker 0 writes the loopback port of its slot count, in the run directory."""

__all__ = ["Crossbar", "announcement"]


class Crossbar(MultiService):
    """The running crossbar: hosts, proxy, status pages and front door. Tests build it
    directly."""

    def __init__(
        self,
        config: Config,
        reactor: Any,
        worker: WorkerInfo | None = None,
        load: Callable[[], Config] | None = None,
    ) -> None:
        super().__init__()
        self.config, self.worker, self._reactor = config, worker, reactor
        self.load = load
        """Reads the config file again for a reload; ``None`` when there is none (a demo)."""
        self.reloads = Reloads(reactor.seconds())
        self.siblings: Callable[[], None] | None = None
        """With workers, worker 0 asks the others to reload through this."""
        self.hosts = hosts = Hosts(config, reactor)
        self.table, self.traffic, self.poller = hosts.table, hosts.traffic, hosts.poller
        self.recent, self.hourly = hosts.recent, hosts.hourly
        self.metrics = Metrics(self.table, self.traffic, reactor)
        self.metrics.count_reloads(self.reloads)
        self.model_events = hosts.model_events  # loads and evictions, logged
        self.metrics.registry.register(self.model_events)  # and counted
        self.usage = _usage_ledger(config, reactor, self.table.knows)
        access = AccessLog(self.table.knows, text=config.log_format == "text")
        observers = (self.metrics, self.recent, self.hourly, access)
        self._observer = Observers(*observers, *([self.usage] if self.usage else []))
        self.share = _share(config, worker, self.traffic, self.table, reactor)
        self.waits = Waits(self.traffic, self.table, reactor, self.share)
        self.prefix_saves = PrefixSaves(self._prefix_files)
        self.prefix_counts = PrefixCounts()
        self.proxy = ProxyResource(self._context(config))
        self.status = self._status_app(config, reactor, worker)
        shared = worker is not None or config.listen_reuse_port
        private = None if worker is None else _private(worker)
        pages = PageResources(self.status.resource(), self.status.probes(), self.status.own_root())
        door = Sites(config, reactor, self.proxy, pages, self._observer, shared=shared,
                         private=private)  # fmt: skip
        self.door, self.site, self.listener = door, door.site, door.listener
        self.status_listener = door.status_listener
        self.metrics.count_connections(self.site)
        for service in (hosts.closer, self.poller, door):
            service.setServiceParent(self)
        if self.share is not None:
            self.share.waits = self.waits
            self.metrics.registry.register(self.share)
            _sharing(config, worker, self.share, reactor).setServiceParent(self)
        if shared:
            self.listener.listening.addCallback(self._accept_once_polled)
        if worker is None or worker.index == 0:
            self.listener.listening.addCallback(self._announce)

    def _status_app(self, config: Config, reactor: Any, worker: WorkerInfo | None) -> StatusApp:
        gather = None if worker is None else lambda: self._all_metrics(worker)
        return StatusApp(
            config,
            self.table,
            self.traffic,
            self.metrics,
            reactor,
            gather_metrics=gather,
            recent=self.recent,
            hourly=self.hourly,
            worker=worker,
            reloads=self.reloads,
            reload=self.reload_everywhere,
            usage=self.usage,
            prefixes=(self.prefix_counts, self.prefix_saves),
        )

    def startService(self) -> None:
        if self.usage is not None:
            self.usage.startService()
        super().startService()

    def stopService(self) -> Deferred[Any]:
        """Drain, then stop the poller, the pools and the listeners; then write the last
        batch of usage, every request's (stopped last: all of them have ended)."""

        async def stop() -> None:
            await self.drain()
            await MultiService.stopService(self)
            if self.usage is not None:
                await self.usage.stopService()

        return Deferred.fromCoroutine(stop())

    async def drain(self) -> None:
        """Stop taking requests; let those in flight finish, for up to ``drain_timeout``."""
        if self.status.draining:
            return
        self.status.draining = True
        self.waits.drain()  # nobody waits for a slot of a crossbar that stops, from now on
        await self.door.drain(self.config.drain_timeout)

    def _context(self, config: Config) -> ProxyContext:
        hosts, reactor, observer = self.hosts, self._reactor, self._observer
        self.waits.configure(config)
        traffic, upstreams = hosts.traffic, hosts.upstreams
        keys = {name: {b"Authorization": [b"Bearer " + h.api_key.value]}
                for name, h in config.hosts.items() if h.api_key}  # fmt: skip
        prefixes = PrefixKeeper(
            hosts.client, config.urls, reactor, self.prefix_saves, self.prefix_counts, keys
        )
        return ProxyContext(
            config,
            hosts.table,
            traffic,
            upstreams,
            reactor,
            observer,
            self.waits,
            prefixes=prefixes,
            placements=None if self.share is None else self.share.placements,
        )

    def _prefix_files(self, host: str) -> int:
        """The files of shared prefixes ``host`` may hold (its ``prefix_files``)."""
        settings = self.config.settings.get(host)
        return (settings or HostSettings()).prefix_files

    # -- reload ----------------------------------------------------------------------------

    def reload(self) -> Reloaded:
        """Read the config file again and apply it to new requests; requests in flight
        finish as they began. A config that fails to load is refused whole and the one
        in force keeps serving."""
        now = self._reactor.seconds()
        if self.load is None:
            return _said(Reloaded(False, "reload refused: there is no config file", conflict=True))
        if self.status.draining:
            return _said(Reloaded(False, "reload refused: crossbar is stopping", conflict=True))
        try:
            changes = compare(self.config, self.load())
            self._apply(changes)
        except ConfigError as e:
            self.reloads.failed(now, str(e))
            return _said(Reloaded(False, f"reload refused, the config in force stays: {e}"))
        except Exception as e:  # whatever it is, the config in force keeps serving
            log.failure("crossbar: unexpected error applying a reloaded config")
            reason = f"reload failed, the config in force stays: {describe(e)}"
            self.reloads.failed(now, reason)
            return _said(Reloaded(False, reason))
        self.reloads.applied(now)
        for line in changes.ignored:
            log.warn("reload: {line}", line=line)
        summary = changes.summary()
        return _said(Reloaded(True, f"reloaded {self.config.source}: {summary}", changes.ignored))

    def reload_everywhere(self) -> Reloaded:
        """Reload this process and, with workers, every worker: worker 0 tells the others;
        another worker asks worker 0, which reloads them all (this one included)."""
        worker = self.worker
        if worker is not None and worker.index != 0:
            os.kill(os.getppid(), signal.SIGHUP)
            return Reloaded(True, f"asked worker 0 to reload all {worker.count} workers")
        result = self.reload()
        if result.ok and self.siblings is not None:
            self.siblings()
        return result

    def _apply(self, changes: Changes) -> None:
        """Everything that can fail is built before anything running is changed."""
        config = changes.config
        take_config = self.door.prepare(config)
        leaving = self.hosts.apply(changes)
        for name in leaving:
            count = count_requests(self.traffic.in_flight.get(name, 0), "in flight")
            log.info(
                "host {name} left the config: kept until its {count} end", name=name, count=count
            )
        take_config()
        self.config = self.status.config = config
        self.proxy.context = self._context(config)
        if self.usage is not None:
            self.usage.retention = config.usage_retention

    def _accept_once_polled(self, port: Any) -> Any:
        """A port shared with other processes (workers, an upgrade's old crossbar) takes
        no connection before every host has been polled once: the kernel sends this
        process its share of new connections as soon as it listens, and until its polls
        end it knows of no healthy host (a 503 for each). They wait in the backlog
        meanwhile, and are served, not refused."""
        port.stopReading()

        def accept(_: object) -> None:
            if self.listener.port is not None:  # not closed meanwhile
                port.startReading()

        self.poller.first_round.addCallback(accept)
        return port

    def _announce(self, port: IListeningPort) -> None:
        """Say what this crossbar serves, with the base URLs to paste into an agent."""
        pages = self.status_listener.port if self.status_listener is not None else None
        lines = announcement(self.config, _port(port), gethostname(), _port(pages))
        for line in lines:
            log.info("{line}", line=line)

    def _all_metrics(self, worker: WorkerInfo) -> Deferred[bytes]:
        own = self.metrics.render()
        return Deferred.fromCoroutine(gather_metrics(worker, own, self.hosts.client))


def _usage_ledger(config: Config, reactor: Any, knows: Callable[[str], bool]) -> UsageLedger | None:
    """The observer that keeps usage in ``usage_db``; ``None`` when it is off."""
    if config.usage_db is None:
        return None
    store, thread = UsageStore(config.usage_db), OneThread(reactor)
    queries = None  # a database in memory has one connection: queries share the writer's
    if config.usage_db != MEMORY_DB:
        reading = UsageStore(config.usage_db, reading=True)
        queries = UsageQueries(reading, OneThread(reactor, "crossbar-usage-read"))
    return UsageLedger(store, config.usage_retention, reactor, thread, knows, queries=queries)


def _said(result: Reloaded) -> Reloaded:
    """Log a reload's outcome: one line."""
    if result.ok:
        log.info("{line}", line=result.message, reload="ok")
    else:
        log.warn("{line}", line=result.message, reload="refused")
    return result


def _private(worker: WorkerInfo) -> Private:
    """A worker's private port: only its peers come in (the run's secret), and its port is
    written where they find it."""
    where = worker.port_file(worker.index)
    return Private(peer_secret(worker), lambda port: publish_port(port, where))


def _share(
    config: Config, worker: WorkerInfo | None, traffic: Traffic, table: HealthTable, reactor: Any
) -> Member | None:
    """With a shared store or workers, this process's part in the fleet's one count of
    slots, and in ``cache_affinity``'s placements."""
    affinity = traffic.policies.named(CacheAffinity.name)
    assert isinstance(affinity, CacheAffinity)
    placements = PlacementSync(
        affinity.conversations, reactor, lambda host: table.get(host) is not None
    )
    if config.shared_state is not None:
        index = "" if worker is None else f" worker {worker.index}"
        name = f"{gethostname()} pid {os.getpid()}{index}"
        keeper = f"the store {config.shared_state.shown}"
        member = Member(name, traffic, reactor, keeper, placements)
    elif worker is not None and worker.count > 1:
        member = Member(f"worker {worker.index}", traffic, reactor, placements=placements)
    else:
        return None
    traffic.changed = member.changed
    return member


def _sharing(config: Config, worker: WorkerInfo | None, member: Member, reactor: Any) -> Service:
    """With a store, every process joins it; else worker 0 keeps the count (on a loopback
    port, for the others) and the others join it."""
    if config.shared_state is not None:
        return storing(reactor, member, config.shared_state)
    assert worker is not None
    secret = peer_secret(worker).value.decode("ascii")
    where = Path(worker.run_dir) / SLOTS_PORT_FILE
    if worker.index == 0:
        return keeping(reactor, member, secret, lambda port: publish_port(port, where))
    return joining(reactor, member, secret, lambda: read_port(where))


def _port(port: IListeningPort | None) -> int | None:
    return None if port is None else getattr(port.getHost(), "port", None)


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
    elif KeyGuard.pages_take_route_keys(config):
        pages += (
            "; any route's key is required, since status_keys is empty"
            " (set status_keys to keep the pages for admins)"
        )
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

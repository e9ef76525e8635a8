"""The hosts' machinery as one unit: the health table, its poller, the traffic counters,
the connection pools and the recent and hourly windows, built from a config and changed
in place by a reload.

A reload changes them together, so that they always name the same hosts: a host that
stays keeps its state, counters and idle connections; a new one starts ``unknown`` and
is polled at once; one that left the config but still carries requests stays (polled,
never chosen, since no route names it) until its last request ends, and is then
forgotten everywhere at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from treq.client import HTTPClient
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorProcess
from twisted.logger import Logger
from twisted.web.client import HTTPConnectionPool

from crossbar.config import Changes, Config, HostConfig, Secret, moved
from crossbar.pages import ModelEvents
from crossbar.polling import HealthTable, HostState, ListReader, Poller
from crossbar.queueing import Traffic
from crossbar.routing import places_conversations
from crossbar.stats import HourlyTraffic, RecentTraffic
from crossbar.upstream import Upstreams, make_agent, make_agents, make_pool

log = Logger()

MAX_IDLE_PER_HOST = 64
"""Idle upstream connections kept per host for the proxy."""


def log_transition(old: HostState, new: HostState) -> None:
    """One log line when a host changes state, not one per poll."""
    if new.healthy:
        log.info("host {name} is up", name=new.name, host_state="up")
    else:
        log.warn(
            "host {name} is down: {reason}", name=new.name, reason=new.last_err, host_state="down"
        )


class Hosts:
    """Everything crossbar keeps per host; :attr:`poller` and :attr:`closer` are the
    services to start and stop with crossbar."""

    def __init__(self, config: Config, reactor: Any) -> None:
        self._reactor = reactor
        self._configured: dict[str, HostConfig] = dict(config.hosts)
        """The hosts of every config since start that are still in the table."""
        settings = config.settings
        # the other workers' (or replicas') slots are counted too
        shared = config.workers > 1 or config.shared_state is not None
        self.traffic = Traffic(config.hosts, config.routes, _slots(config), shared)
        self._config = config
        self.model_events = ModelEvents(self.traffic.usage, reactor)
        """The loads and evictions the polls saw, logged and counted."""
        self.table = HealthTable(
            config.urls,
            reactor,
            settings,
            listeners=(log_transition,),
            slots_learned=self._slots_learned,
            models_changed=self.model_events.seen,
        )
        self._pool = make_pool(reactor, per_host=1)
        self.client = HTTPClient(make_agent(reactor, self._pool, {}, {}))
        """treq for crossbar's own asks that are not polls (other workers' metrics)."""
        self._poll_pools: dict[str, HTTPConnectionPool] = {}
        """Each host's own pool for its polls, kept while its address and CA stay."""
        clients = self._poll_clients(config.hosts)
        # A long model list is read in a child process, where the reactor can start one.
        read = (
            ListReader(reactor, self._reactor).read if IReactorProcess.providedBy(reactor) else None
        )
        self.poller = Poller(self.table, clients, reactor, keys=_keys(config.hosts), read=read)
        connect_timeouts = {name: s.connect_timeout for name, s in settings.items()}
        self.upstreams = Upstreams(
            reactor,
            config.urls,
            connect_timeouts,
            max_idle=MAX_IDLE_PER_HOST,
            tls_cas=_cas(config.hosts),
        )
        self.recent = RecentTraffic(config.hosts, reactor, _affine(config))
        self.hourly = HourlyTraffic(config.hosts, reactor)
        self.closer = _ClosePools([self._pool], self._poll_pools, self.upstreams)

    def _slots_learned(self) -> None:
        """A host said how many slots a model runs: ``cache_affinity`` counts with them."""
        config = self._config
        self.traffic.policies.reload(config.routes, _slots(config, self.table.view))

    def apply(self, changes: Changes) -> list[str]:
        """Take the hosts and routes of a reloaded config; returns the hosts that left
        the config but finish their requests first."""
        config = changes.config
        # A new address under a known name, including a name that left the config and
        # comes back before its last request ended: a new host.
        known = self._configured
        fresh = [n for n, h in config.hosts.items() if n in known and moved(known[n], h)]
        self._config = config
        leaving = self.traffic.set_hosts(config.hosts, config.routes, _slots(config), self._gone)
        self._slots_learned()  # what hosts said of their slots counts where the config is silent
        hosts = {**{n: known[n] for n in leaving}, **config.hosts}
        self._configured = hosts
        self.table.set_hosts(config.urls, config.settings, fresh=fresh, keep=leaving)
        settings = self.table.settings
        self.upstreams.set_hosts(
            {name: host.url for name, host in hosts.items()},
            {name: settings[name].connect_timeout for name in hosts},
            _cas(hosts),
            fresh=fresh,
            keep=leaving,
        )
        for name in fresh:  # a new address or CA: its kept-alive poll connection goes
            self._close_poll_pool(name)
        restart = (*fresh, *changes.hosts_retuned)
        self.poller.set_hosts(self._poll_clients(hosts), _keys(hosts), restart=restart)
        self.recent.set_hosts(config.hosts, _affine(config))
        self.hourly.set_hosts(config.hosts)
        return leaving

    def _gone(self, name: str) -> None:
        """A host that left the config has ended its last request: forget it."""
        self._configured.pop(name, None)
        self.poller.forget(name)
        self._close_poll_pool(name)
        self.table.remove(name)
        self.upstreams.drop(name)
        log.info("host {name} removed: its last request has ended", name=name)

    def _poll_clients(self, hosts: Mapping[str, HostConfig]) -> dict[str, HTTPClient]:
        """treq for the polls, one per host, with its poll timeout and its own CA (never
        the CA of another host at the same address)."""
        settings = self.table.settings
        timeouts = {name: settings[name].poll_timeout for name in hosts}
        urls = {name: host.url for name, host in hosts.items()}
        pools = self._poll_pools
        for name in urls:
            if name not in pools:
                pools[name] = make_pool(self._reactor, per_host=1)
        agents = make_agents(self._reactor, pools, urls, timeouts, tls_cas=_cas(hosts))
        return {name: HTTPClient(agent) for name, agent in agents.items()}

    def _close_poll_pool(self, name: str) -> None:
        pool = self._poll_pools.pop(name, None)
        if pool is not None:
            pool.closeCachedConnections()


class _ClosePools(Service):
    """Drops kept-alive upstream connections when crossbar stops."""

    def __init__(
        self,
        own: Iterable[HTTPConnectionPool],
        polls: Mapping[str, HTTPConnectionPool],
        upstreams: Upstreams,
    ) -> None:
        self._own = list(own)
        self._polls = polls
        self._upstreams = upstreams

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        pools = [*self._own, *self._polls.values()]
        closing = [pool.closeCachedConnections() for pool in pools]
        return DeferredList([*closing, self._upstreams.close()])


def _slots(config: Config, states: Mapping[str, HostState] | None = None) -> dict[str, int]:
    """Each host's slots as ``cache_affinity`` counts them: the config's ``slots:``, else
    what the host said of its loaded models (the most any of them runs)."""
    slots = {name: h.slots for name, h in config.hosts.items() if h.slots is not None}
    for name, state in (states or {}).items():
        if name not in slots and name in config.hosts and state.slots:
            slots[name] = max(state.slots.values())
    return slots


def _cas(hosts: Mapping[str, HostConfig]) -> dict[str, bytes]:
    return {name: h.tls_ca for name, h in hosts.items() if h.tls_ca}


def _keys(hosts: Mapping[str, HostConfig]) -> dict[str, Secret]:
    return {name: h.api_key for name, h in hosts.items() if h.api_key}


def _affine(config: Config) -> Iterable[str]:
    return [name for name, r in config.routes.items() if places_conversations(r)]

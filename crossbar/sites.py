"""The front door: the sites clients come in through, the keys that guard them, and the
ports they listen on, as one service built from the config and changed by a reload.

- the main site serves the proxy and, under ``/_crossbar/``, the pages (only the probes
  when ``status_listen`` gives the pages a port of their own);
- that port of the pages' own, when set;
- with workers, a private loopback port where the other workers ask for this one's
  metrics and reloads (guarded like the pages: any local user can reach loopback).

Every site takes the config's keys and limits again on a reload, and hands each request
refused at its door to the same observer as the proxy's requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.application.service import MultiService
from twisted.internet.endpoints import TCP4ServerEndpoint, serverFromString
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.web.resource import IResource, Resource

from crossbar.config import Config, Limits, Secret, shown_listen
from crossbar.http import KeyGuard, Listener, Pages, Peers, ReusePortEndpoint, Site, drain
from crossbar.proxy import RootResource
from crossbar.stats import ProxyObserver

CLIENT_IDLE_TIMEOUT = 75.0
"""Seconds an idle client connection is kept open."""
PRIVATE_IDLE_TIMEOUT = 30.0


@attrs.frozen
class PageResources:
    """The status pages, as the front door serves them."""

    all: IResource
    """Every page, under ``/_crossbar/``."""
    probes: IResource
    """Only ``livez`` and ``readyz``: the main port's, when the pages have their own."""
    own: IResource
    """The root of the pages' own port."""


@attrs.frozen
class Private:
    """A worker's private port (``workers: N``)."""

    secret: Secret
    """The run's secret: only the worker's peers come in, whatever keys the config has."""
    listening: Callable[[IListeningPort], object]
    """Called with the port once it is open (to say where it is)."""


class Sites(MultiService):
    """The sites, their guards and their listeners. ``shared``: the ports are shared
    with other processes (workers, an upgrade's new crossbar) through ``SO_REUSEPORT``;
    ``private``: with workers, the private port."""

    def __init__(
        self,
        config: Config,
        reactor: Any,
        proxy: IResource,
        pages: PageResources,
        observer: ProxyObserver,
        *,
        shared: bool = False,
        private: Private | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        self._reactor = reactor
        self._observer = observer
        self._guarded: list[tuple[Site, Pages]] = []
        """Each site with which of the pages it guards: their keys change with a reload."""
        own_pages = config.status_listen is not None
        root = RootResource(proxy)
        root.putChild(b"_crossbar", pages.probes if own_pages else pages.all)
        self.site = self._site("probes" if own_pages else "all", root, proxy=proxy)
        self.sites = [self.site]
        """The sites that serve clients: the config's limits, and drained on a stop."""
        if private is not None:
            admin = Resource()
            admin.putChild(b"_crossbar", pages.all)
            peers = Peers(private.secret)
            site = self._site(
                peers, admin, internal=True, timeout=PRIVATE_IDLE_TIMEOUT, limits=Limits()
            )
            port = Listener(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"), site)
            port.setServiceParent(self)
            port.listening.addCallback(private.listening)
        self.status_listener: Listener | None = None
        if config.status_listen is not None:
            # Started before the main port, so that the announcement knows both.
            # internal: announced with the routes, not as a second crossbar.
            pages_site = self._site("only", pages.own, internal=True)
            self.sites.append(pages_site)
            endpoint = _endpoint(reactor, config.status_listen, shared)
            name = shown_listen(config.status_listen)
            self.status_listener = Listener(endpoint, pages_site, name=name)
            self.status_listener.setServiceParent(self)
        endpoint = _endpoint(reactor, config.listen, shared)
        self.listener = Listener(endpoint, self.site, name=shown_listen(config.listen))
        self.listener.setServiceParent(self)

    def _site(self, pages: Pages, resource: IResource, **kwargs: Any) -> Site:
        """A site guarded by the config's keys for ``pages`` (and again after a reload)."""
        kwargs.setdefault("limits", self._config.limits)
        kwargs.setdefault("timeout", CLIENT_IDLE_TIMEOUT)
        kwargs.setdefault("reactor", self._reactor)
        guard = guard_for(self._config, pages)
        site = Site(
            resource,
            guard=guard,
            observer=self._observer,
            parsePOSTFormSubmission=False,  # a proxy reads no forms
            **kwargs,
        )
        self._guarded.append((site, pages))
        return site

    def prepare(self, config: Config) -> Callable[[], None]:
        """Build what a reloaded ``config`` changes here (anything that can fail, before
        anything running is changed); the answer applies it."""
        guards = [(site, guard_for(config, pages)) for site, pages in self._guarded]

        def apply() -> None:
            for site, guard in guards:
                site.guard = guard
            for site in self.sites:
                site.limits = config.limits
            self._config = config

        return apply

    async def drain(self, timeout: float) -> None:
        """Stop taking requests; let those in flight finish, for up to ``timeout``."""
        listeners = (self.listener, self.status_listener)
        await drain(self.sites, listeners, timeout, self._reactor)


def guard_for(config: Config, pages: Pages) -> KeyGuard | None:
    """The keys of a listener, or ``None`` where there are none to ask for."""
    guard = KeyGuard.for_config(config, pages)
    return guard if guard.needed else None


def _endpoint(reactor: Any, listen: str, shared: bool) -> IStreamServerEndpoint:
    """Where to listen; ``shared`` with other processes through ``SO_REUSEPORT``."""
    return ReusePortEndpoint(reactor, listen) if shared else serverFromString(reactor, listen)

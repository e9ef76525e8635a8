"""The proxy's twisted.web resources: everything under the root is proxied, except
the children put on it (``/_crossbar/``)."""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web import server
from twisted.web.resource import IResource, Resource

from crossbar.config import Config
from crossbar.fleet import HealthTable, ProxyObserver, Traffic
from crossbar.server.exchange import Exchange
from crossbar.upstream import Upstreams


class RootResource(Resource):
    """Everything is proxied except the children put on it (``/_crossbar/``)."""

    def __init__(self, proxy: ProxyResource) -> None:
        super().__init__()
        self._proxy = proxy

    def getChild(self, path: bytes, request: Any) -> IResource:
        return self._proxy


class ProxyResource(Resource):
    """Proxies every request it is given; one :class:`Exchange` each."""

    isLeaf = True

    def __init__(
        self,
        config: Config,
        table: HealthTable,
        traffic: Traffic,
        upstreams: Upstreams,
        clock: IReactorTime,
        observer: ProxyObserver,
    ) -> None:
        super().__init__()
        self.config = config
        self.table = table
        self.traffic = traffic
        self.upstreams = upstreams
        self.clock = clock
        self.observer = observer
        self.settings = table.settings

    def render(self, request: server.Request) -> int:
        if getattr(request, "rejected", False):
            return server.NOT_DONE_YET
        Exchange(self, request).start()
        return server.NOT_DONE_YET

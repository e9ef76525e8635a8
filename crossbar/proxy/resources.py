"""The proxy's twisted.web resources: everything under the root is proxied, except
the children put on it (``/_crossbar/``)."""

from __future__ import annotations

from typing import Any

from twisted.web import server
from twisted.web.resource import IResource, Resource

from crossbar.http import ProxyRequest
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.exchange import Exchange


class RootResource(Resource):
    """Everything is proxied except the children put on it (``/_crossbar/``)."""

    def __init__(self, proxy: IResource) -> None:
        super().__init__()
        self._proxy = proxy

    def getChild(self, path: bytes, request: Any) -> IResource:
        return self._proxy


class ProxyResource(Resource):
    """Proxies every request it is given; one :class:`Exchange` each."""

    isLeaf = True

    def __init__(self, context: ProxyContext) -> None:
        super().__init__()
        self.context = context

    def render(self, request: server.Request) -> int:
        if isinstance(request, ProxyRequest) and request.rejected:
            return server.NOT_DONE_YET
        Exchange(self.context, request).start()
        return server.NOT_DONE_YET

"""A proxy's site on a ``Clock`` and a ``StringTransport``: connections built by the site,
fed a request's raw bytes, with a proxy and pages that never answer (for the tests of
:mod:`crossbar.http.site` and :mod:`crossbar.http.request`)."""

from __future__ import annotations

import json
from typing import Any

import attrs
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web import server
from twisted.web.resource import Resource

from crossbar.config import Limits
from crossbar.http.site import Channel, Site

CHAT = b"/lab/v1/chat/completions"
PEER = IPv4Address("TCP", "127.0.0.1", 40000)
MiB = 1024 * 1024
DEFAULTS = Limits()


class Leaf(Resource):
    """Records the requests it renders, and answers none of them yet."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.rendered: list[server.Request] = []

    def render(self, request: server.Request) -> object:
        self.rendered.append(request)
        return server.NOT_DONE_YET


@attrs.define
class Conn:
    """One client connection to a site, over a StringTransport."""

    channel: Channel
    transport: StringTransport

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    @property
    def answer(self) -> bytes:
        return self.transport.value()

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)

    def refusal(self) -> tuple[int, dict[bytes, bytes], Any]:
        """Status, headers (lower-case names) and JSON body of a refusal."""
        head, _, body = self.answer.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}
        assert int(headers[b"content-length"]) == len(body)
        return int(status_line.split()[1]), headers, json.loads(body) if body else None


class CountingClock(Clock):
    """A Clock that counts the timers set on it, cancelled or not."""

    scheduled = 0

    def callLater(self, delay: float, callable: Any, *args: Any, **kw: Any) -> Any:
        self.scheduled += 1
        return super().callLater(delay, callable, *args, **kw)


@attrs.define
class Door:
    """A site with a proxy and pages that never answer, on a Clock."""

    site: Site
    proxy: Leaf
    pages: Leaf
    clock: CountingClock

    def connect(self, peer: IPv4Address | IPv6Address = PEER) -> Conn:
        channel = self.site.buildProtocol(peer)
        assert isinstance(channel, Channel), f"the connection from {peer.host} was refused"
        transport = StringTransport(peerAddress=peer)
        channel.makeConnection(transport)
        return Conn(channel, transport)

    @property
    def rendered(self) -> list[server.Request]:
        return self.proxy.rendered + self.pages.rendered


def door(limits: Limits = DEFAULTS, guard: Any = None, timeout: float | None = None) -> Door:
    """``timeout``: the site's idle timeout (none by default)."""
    proxy, pages, clock = Leaf(), Leaf(), CountingClock()
    root = Resource()
    root.putChild(b"_crossbar", pages)
    site = Site(root, proxy=proxy, limits=limits, guard=guard, reactor=clock, timeout=timeout)
    return Door(site, proxy, pages, clock)


def peer(host: str) -> IPv4Address:
    """A client at ``host`` (each address has its share of the connections)."""
    return IPv4Address("TCP", host, 40000)


def post(path: bytes = CHAT, body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n%s\r\n%s" % (
        path,
        len(body),
        extra,
        body,
    )


def get(path: bytes, method: bytes = b"GET", extra: bytes = b"") -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: a\r\n%s\r\n" % (method, path, extra)


def chunked(*chunks: bytes, end: bool = True) -> bytes:
    data = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return data + (b"0\r\n\r\n" if end else b"")


CHUNKED_HEAD = b"POST %s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" % CHAT

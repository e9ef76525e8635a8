"""twisted.web's server side, made fit for a proxy on a shared network: a request
body limit enforced as the body arrives, a deadline for request headers, chunks
framed and written in one piece, and no access log of twisted.web's own."""

from __future__ import annotations

import time
from io import BytesIO
from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, ITCPTransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import IResource

from crossbar._twisted import client_gone, direct, handling_request, request_line, write_now
from crossbar.server.listening import INTERNAL_LISTENER
from crossbar.server.rewrite import json_body
from crossbar.server.timers import stop

MAX_BODY = 16 * 1024 * 1024
HEADER_DEADLINE = 30.0
"""Seconds a client has to send a request's headers."""
LINGER = 5.0
"""Seconds a refused upload may keep sending before its connection is closed."""

log = Logger()
_date = (0, b"")


def http_date() -> bytes:
    """The ``Date`` header's value, formatted once a second, not once a request."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, http.datetimeToString(now))
    return _date[1]


class ProxyRequest(server.Request):
    """A request that keeps its body in memory and refuses one over ``MAX_BODY``.

    twisted.web buffers a whole body before ``render`` with no cap of its own, so the
    limit is enforced here as the body arrives: from ``Content-Length`` before any of
    it is read, and for a chunked upload as soon as it passes the limit.
    """

    rejected = False
    _received = 0
    _buffer: BytesIO
    _linger: Any = None

    def process(self) -> None:
        """Hand a proxied request straight to the proxy.

        twisted.web's own dispatch walks the resource tree, unquotes every path segment
        and formats ``Date`` and ``Server`` headers, all for a leaf that takes every path
        but ``/_crossbar/`` and an answer whose headers are the host's: about a twentieth
        of crossbar's CPU per request. Everything else goes the usual way.
        """
        site: Any = self.channel.site  # type: ignore[attr-defined]
        proxy = site.proxy
        path = self.path
        if proxy is None or path.startswith(b"/_crossbar") or path == b"*":
            super().process()
            return
        self.site = site
        self.prepath = []
        self.postpath = []
        self.setHeader(b"date", http_date())
        try:
            self.render(proxy)
        except BaseException:
            self.processingFailed(Failure())

    def write(self, data: bytes) -> None:
        """Frame a chunk of a streamed answer in one piece; the first write (headers,
        and the choice of framing) and every unusual case stay twisted.web's."""
        if self.chunked and self.startedWriting and not self.finished and data:
            if not client_gone(self):
                self.sentLength += len(data)
                channel: Any = self.channel
                write_now(channel._direct, channel.transport, b"%x\r\n%s\r\n" % (len(data), data))
            return
        super().write(data)

    def gotLength(self, length: int | None) -> None:
        self.content = self._buffer = BytesIO()
        if length is not None and length > MAX_BODY:
            self._reject()

    def handleContentChunk(self, data: bytes) -> None:
        if self.rejected:
            return
        self._received += len(data)
        if self._received > MAX_BODY:
            self._reject()
        else:
            self._buffer.write(data)

    def _reject(self) -> None:
        """Answer 413 at once, outside twisted.web's request cycle that has not begun."""
        self.rejected = True
        self.content = self._buffer = BytesIO()
        # Twisted would otherwise invite the client to send the body we refuse.
        self.requestHeaders.removeHeader(b"expect")
        body = json_body({"error": "body too large"})
        transport: Any = self.channel.transport
        transport.write(
            b"HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        # Half-close and keep draining, so the client reads the 413 rather than a
        # reset; a client that goes on sending is cut off after LINGER seconds.
        if ITCPTransport.providedBy(transport):
            transport.loseWriteConnection()
        else:
            transport.loseConnection()
        self._linger = self.channel.callLater(LINGER, transport.abortConnection)
        command, target = request_line(self.channel)
        method = command.decode("latin-1", "replace")
        path = target.partition(b"?")[0]
        log.info(
            "- - {method} {path} 413 0ms", method=method, path=path.decode("latin-1", "replace")
        )

    def connectionLost(self, reason: Failure) -> None:
        stop(self._linger)
        super().connectionLost(reason)


class Channel(http.HTTPChannel):
    """An HTTP connection that gives each request a deadline for its headers.

    The Site's idle timeout restarts on every byte, so a client that trickles its
    headers (slowloris) could otherwise hold a connection open forever.
    """

    _deadline: IDelayedCall | None = None
    _in_body = False
    _host: Any = None
    _direct: Any = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self._direct = direct(self.transport)

    def write(self, data: bytes) -> None:
        write_now(self._direct, self.transport, data)

    def writeSequence(self, iovec: Any) -> None:
        self.write(b"".join(iovec))

    def getHost(self) -> Any:
        """The local address, asked of the kernel once per connection, not per request."""
        if self._host is None:
            self._host = super().getHost()
        return self._host

    def dataReceived(self, data: bytes) -> None:
        if self._deadline is None and not self._in_body and not handling_request(self):
            limit = getattr(getattr(self, "site", None), "header_deadline", HEADER_DEADLINE)
            self._deadline = self.callLater(limit, self._too_slow)
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._stop_deadline()
        self._in_body = True
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        self._in_body = False
        super().allContentReceived()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._stop_deadline()
        super().connectionLost(reason)

    def _stop_deadline(self) -> None:
        stop(self._deadline)
        self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )
        self.transport.loseConnection()


class Site(server.Site):
    """A Site whose requests are :class:`ProxyRequest` and that writes no access log
    of its own: the proxy logs one line per request when it really ends. Requests for
    any path but ``/_crossbar/`` go straight to ``proxy`` (see ProxyRequest.process)."""

    requestFactory = ProxyRequest
    noisy = False
    protocol = Channel  # type: ignore[assignment]  # plain HTTP/1.1, no HTTP/2 upgrade
    header_deadline = HEADER_DEADLINE

    def __init__(
        self,
        resource: IResource,
        proxy: IResource | None = None,
        internal: bool = False,
        **kwargs: Any,
    ):
        super().__init__(resource, **kwargs)
        self.proxy = proxy
        self._prefix = INTERNAL_LISTENER if internal else "crossbar"

    def logPrefix(self) -> str:
        return self._prefix

    def log(self, request: Any) -> None:
        pass

"""The proxy: a ``twisted.web`` resource that forwards each request to the right host
and streams the answer back chunk by chunk.

One :class:`Exchange` lives per request. It forwards with a raw ``Agent`` on a
persistent pool (treq's cookie jar and redirects are wrong for a proxy), streams
the upstream body through a protocol given to ``Response.deliverBody``, lets the
client's socket pause the upstream socket (backpressure), and closes the upstream
connection as soon as the client leaves so the GPU stops generating.
"""

from __future__ import annotations

import json
from io import BytesIO
from typing import Any, Protocol

from twisted.internet import protocol
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IConsumer, IReactorTime, ITCPTransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import Agent, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer, IResponse
from twisted.web.resource import IResource, Resource
from zope.interface import implementer

from crossbar.config import Config
from crossbar.failures import describe, stop_producing
from crossbar.health import HealthTable
from crossbar.routing import BadTarget, allowed_path, choose, parse_target, peek_model, with_model

MAX_BODY = 16 * 1024 * 1024
LINGER = 5.0
"""Seconds a refused upload may keep sending before its connection is closed."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
_NOT_RETURNED = HOP_BY_HOP | {b"content-length"}
_BODYLESS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS"})

log = Logger()


class ProxyObserver(Protocol):
    """What the proxy reports of each request when it ends (metrics live elsewhere)."""

    def request_done(
        self,
        route: str,
        host: str | None,
        status: int,
        seconds: float,
        first_byte: float | None,
        sent: int,
    ) -> None: ...


class _NoObserver:
    def request_done(self, *args: object) -> None:
        pass


def json_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


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
        method = getattr(self.channel, "_command", b"-").decode("latin-1", "replace")
        path = getattr(self.channel, "_path", b"-").partition(b"?")[0]
        log.info(
            "- - {method} {path} 413 0ms", method=method, path=path.decode("latin-1", "replace")
        )

    def connectionLost(self, reason: Failure) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        super().connectionLost(reason)


class Site(server.Site):
    """A Site whose requests are :class:`ProxyRequest` and that writes no access log
    of its own: the proxy logs one line per request when it really ends."""

    requestFactory = ProxyRequest

    def log(self, request: Any) -> None:
        pass


@implementer(IBodyProducer)
class BytesProducer:
    """Sends a request body that is already in memory, in one write."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._body)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class RootResource(Resource):
    """Everything is proxied except the children put on it (``/_crossbar/``)."""

    def __init__(self, proxy: ProxyResource) -> None:
        super().__init__()
        self._proxy = proxy

    def getChild(self, path: bytes, request: Any) -> IResource:
        return self._proxy


class ProxyResource(Resource):
    isLeaf = True

    def __init__(
        self, config: Config, table: HealthTable, agent: IAgent, clock: IReactorTime
    ) -> None:
        super().__init__()
        self.config = config
        self.table = table
        self.agent = agent
        self.clock = clock
        self.observer: ProxyObserver = _NoObserver()
        self.in_flight: dict[str, int] = dict.fromkeys(config.hosts, 0)

    def render(self, request: server.Request) -> int:
        if getattr(request, "rejected", False):
            return server.NOT_DONE_YET
        Exchange(self, request).start()
        return server.NOT_DONE_YET


class _StreamBody(protocol.Protocol):
    """Carries the upstream body to the client as it arrives; no buffering."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def dataReceived(self, data: bytes) -> None:
        self.exchange.sent += len(data)
        self.exchange.request.write(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self.exchange.upstream_ended(reason)


class Exchange:
    """One client request and its one upstream request."""

    def __init__(self, proxy: ProxyResource, request: server.Request) -> None:
        self.proxy = proxy
        self.request = request
        self.started = proxy.clock.seconds()
        self.route = "-"
        self.host: str | None = None
        self.path = b"-"
        self.client_gone = False
        self.finished = False
        self.sent = 0
        self.first_byte: float | None = None
        self._pending: Deferred[IResponse] | None = None
        self._body: _StreamBody | None = None

    def start(self) -> None:
        request = self.request
        request.notifyFinish().addBoth(self._ended)
        try:
            self._forward()
        except BadTarget as e:
            self.fail(e.status, str(e))
        except Exception:
            log.failure("crossbar: unexpected error handling a request")
            self.fail(500, "internal error")

    def _forward(self) -> None:
        request = self.request
        assert request.uri is not None and request.method is not None
        target = parse_target(request.uri)
        self.path = target.rest
        route = self.proxy.config.routes.get(target.route)
        if route is None:
            raise BadTarget(404, "unknown route")
        self.route = route.name
        if not allowed_path(target.rest):
            raise BadTarget(404, "not found")

        body = request.content.getvalue() if request.content is not None else b""
        model = route.default_model
        if body and request.method not in (b"GET", b"HEAD"):
            peek = peek_model(body)
            if peek.model is not None:
                model = peek.model
            elif peek.missing and route.default_model is not None:
                body = with_model(body, route.default_model)

        host = choose(route.hosts, model, self.proxy.table.snapshot())
        if host is None:
            raise BadTarget(503, "no healthy host")
        self.host = host
        self.proxy.in_flight[host] += 1

        url = self.proxy.config.hosts[host].url.encode() + target.rest
        if target.query:
            url += b"?" + target.query
        producer = None
        if body or request.method not in _BODYLESS:
            producer = BytesProducer(body)
        d = self.proxy.agent.request(request.method, url, self._upstream_headers(), producer)
        self._pending = d
        d.addCallbacks(self._got_response, self._upstream_failed)
        d.addErrback(self._crashed)

    def _upstream_headers(self) -> Headers:
        incoming = self.request.requestHeaders
        drop = set(_NOT_FORWARDED)
        for value in incoming.getRawHeaders(b"connection", []):
            drop.update(token.strip().lower() for token in value.split(b","))
        headers = Headers()
        for name, values in incoming.getAllRawHeaders():
            if name.lower() not in drop:
                headers.setRawHeaders(name, values)
        client = getattr(self.request.getClientAddress(), "host", None) or "unknown"
        forwarded = incoming.getRawHeaders(b"x-forwarded-for", [])
        chain = b", ".join([*forwarded, client.encode()])
        headers.setRawHeaders(b"x-forwarded-for", [chain])
        headers.setRawHeaders(
            b"x-forwarded-proto", [b"https" if self.request.isSecure() else b"http"]
        )
        host_header = incoming.getRawHeaders(b"host")
        if host_header:
            headers.setRawHeaders(b"x-forwarded-host", host_header[:1])
        return headers

    def _got_response(self, response: IResponse) -> None:
        self._pending = None
        self.first_byte = self.proxy.clock.seconds() - self.started
        request = self.request
        if self.client_gone:
            response.deliverBody(_Discard())
            return
        request.setResponseCode(response.code, response.phrase)
        out = request.responseHeaders
        out.removeHeader(b"server")
        for name, values in response.headers.getAllRawHeaders():
            if name.lower() not in _NOT_RETURNED:
                out.setRawHeaders(name, values)
        if isinstance(response.length, int):
            out.setRawHeaders(b"content-length", [b"%d" % response.length])
        assert self.host is not None
        out.setRawHeaders(b"x-crossbar-host", [self.host.encode()])
        body = _StreamBody(self)
        self._body = body
        response.deliverBody(body)
        # deliverBody may have finished the whole exchange already (a body that was
        # complete); registering a producer then would raise.
        if not self.finished and not self.client_gone and body.transport is not None:
            request.registerProducer(body.transport, True)

    def _upstream_failed(self, reason: Failure) -> None:
        self._pending = None
        if self.client_gone or reason.check(CancelledError):
            return
        assert self.host is not None
        self.proxy.table.mark_down(self.host, describe(reason))
        log.warn("host {host} failed before answering: {why}", host=self.host, why=describe(reason))
        self.fail(502, "upstream failed", host=self.host)

    def upstream_ended(self, reason: Failure) -> None:
        """The upstream body ended: cleanly, broken, or because the client left."""
        if self.client_gone:
            return
        request = self.request
        if self._body is not None and self._body.transport is not None:
            request.unregisterProducer()
        if reason.check(ResponseDone, PotentialDataLoss):
            self.finished = True
            request.finish()
            return
        assert self.host is not None
        why = describe(reason)
        self.proxy.table.mark_down(self.host, f"answer broken: {why}")
        log.warn("host {host} broke an answer off: {why}", host=self.host, why=why)
        # An SSE client must see an error, not a stream that merely looks complete.
        self.finished = True
        self._abort_client()

    def _crashed(self, reason: Failure) -> None:
        log.failure("crossbar: unexpected error while proxying", reason)
        if not self.finished and not self.client_gone:
            if self.request.startedWriting:
                self._abort_client()
            else:
                self.fail(500, "internal error")

    def _abort_client(self) -> None:
        transport: Any = self.request.transport
        transport.abortConnection()

    def fail(self, status: int, message: str, **extra: str) -> None:
        """Answer with a JSON error."""
        if self.finished or self.client_gone:
            return
        self.finished = True
        body = json_body({"error": message, **extra})
        request = self.request
        request.setResponseCode(status)
        request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
        request.responseHeaders.setRawHeaders(b"content-length", [b"%d" % len(body)])
        if self.host is not None:
            request.responseHeaders.setRawHeaders(b"x-crossbar-host", [self.host.encode()])
        request.write(body)
        request.finish()

    def _ended(self, result: object) -> None:
        """The client's side is over: the answer was sent, or the client left."""
        note = ""
        if isinstance(result, Failure):
            self.client_gone = True
            note = " (client left)"
            if self._pending is not None:
                # Cancel even if the Deferred looks called: after the pool hands over a
                # connection it waits on an inner Deferred, and cancel reaches that.
                self._pending.cancel()
            elif self._body is not None and self._body.transport is not None:
                stop_producing(self._body.transport)
        if self.host is not None:
            self.proxy.in_flight[self.host] -= 1
        seconds = self.proxy.clock.seconds() - self.started
        answered = self.finished or self.request.startedWriting
        status = self.request.code if answered else 499
        self.proxy.observer.request_done(
            self.route, self.host, status, seconds, self.first_byte, self.sent
        )
        log.info(
            "{route} {host} {method} {path} {status} {ms:.0f}ms{note}",
            route=self.route,
            host=self.host or "-",
            method=(self.request.method or b"-").decode("latin-1"),
            path=self.path.decode("latin-1"),
            status=status,
            ms=seconds * 1000,
            note=note,
        )


class _Discard(protocol.Protocol):
    """Closes an upstream answer nobody is waiting for any more."""

    def connectionMade(self) -> None:
        assert self.transport is not None
        stop_producing(self.transport)


def make_agent(reactor: Any, pool: Any, connect_timeout: float = 5.0) -> IAgent:
    return Agent(reactor, pool=pool, connectTimeout=connect_timeout)

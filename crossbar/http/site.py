"""twisted.web's server side, made fit for a proxy on a shared network: deadlines for a
connection's first byte and a request's headers and body, refusals answered from a head
alone (then nothing more is read), caps on open connections (all of them, and one
client's share, the oldest idle one giving way to a new one) and on request bodies held
at once, data sent at once when nothing is queued (an answer's head waits for the end of
the reactor's turn), and no access log of twisted.web's own. Each request is a
:class:`~crossbar.http.request.ProxyRequest`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, ITCPTransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import IResource

from crossbar._twisted import (
    ParserRefusals,
    bytes_waiting,
    direct,
    handling_request,
    request_line,
    write_now,
)
from crossbar.config import Limits
from crossbar.http import admission
from crossbar.http.admission import Guard, Refusal
from crossbar.http.connections import Connections
from crossbar.http.listener import INTERNAL_LISTENER
from crossbar.http.request import ProxyRequest
from crossbar.http.timers import Deadline, nothing, stop
from crossbar.stats import AccessLog, ProxyObserver, refused_record

LINGER = 5.0
"""Seconds a refused request's client may keep sending before its connection is cut."""
DEFAULT_LIMITS = Limits()

log = Logger()


class Channel(ParserRefusals):
    """An HTTP connection with deadlines for a request's headers and its body, that
    refuses a request from its head and then reads nothing more of the connection.

    The Site's idle timeout restarts on every byte, so a client that trickles its
    headers (slowloris) or its body could otherwise hold a connection open forever; a
    new connection's first byte is due within ``head_timeout`` too, so that one that
    says nothing is not kept for the idle timeout.

    Both the head's deadline and the idle timeout (twisted.web's ``TimeoutMixin``, off
    while a request is answered, on again after it) are :class:`Deadline` s: set again
    for every request without making and cancelling a timer each time.
    """

    site: Site
    _head: Deadline
    """The first byte's deadline, then each head's."""
    _idle: Deadline
    """The idle timeout between requests (``timeOut``)."""
    _body_timer: IDelayedCall | None = None
    _answer: Deadline | None = None
    _linger: IDelayedCall | None = None
    _in_body = False
    _refused = False
    _host: Any = None
    _peer: Any = None
    _secure: bool | None = None
    _direct: Any = None
    _silent = True  # not a byte received yet
    heads = 0  # request heads received on this connection; none yet: it is fresh
    client: str | None = None
    """The address whose share of ``max_connections`` it counts in; ``None``: none."""
    idle = False
    """No request under way (none sent yet, or between two): it may give way to a new
    connection at the cap."""

    def connectionMade(self) -> None:
        clock = self.site.reactor
        self._head = Deadline(clock, self._too_slow)
        self._idle = Deadline(clock, self.timeoutConnection)
        super().connectionMade()
        self._direct = direct(self.transport)
        # The first byte's deadline; that byte moves it to the head's.
        self._head.set(self.site.limits.head_timeout)
        if not bytes_waiting(self._direct):  # else its request is under way, unread
            self.site.connections.rest(self)

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Any) -> None:
        """The head as one string: twisted.web hands the transport a sequence of some
        twenty pieces, each checked apart. It still waits for the reactor's turn, with
        whatever follows it, so that the turn's answers go out together."""
        lines = [version, b" ", code, b" ", reason, b"\r\n"]
        for name, values in headers.getAllRawHeaders():
            for value in values:
                lines += (name, b": ", value, b"\r\n")
        lines.append(b"\r\n")
        transport: Any = self.transport
        transport.write(b"".join(lines))

    def write(self, data: bytes) -> None:
        write_now(self._direct, self.transport, data)

    def writeSequence(self, iovec: Any) -> None:
        self.write(b"".join(iovec))

    def getHost(self) -> Any:
        """The local address, asked of the kernel once per connection, not per request."""
        if self._host is None:
            self._host = super().getHost()
        return self._host

    def getPeer(self) -> Any:
        """The client's address, made once per connection (a TCP transport makes a new
        one each time it is asked, and twisted.web asks for every request)."""
        if self._peer is None:
            self._peer = super().getPeer()
        return self._peer

    def isSecure(self) -> bool:
        """Whether the connection is TLS (an interface lookup), asked once per connection."""
        if self._secure is None:
            self._secure = bool(super().isSecure())
        return self._secure

    def dataReceived(self, data: bytes) -> None:
        if self._refused:
            return  # drained: the client reads its refusal rather than a reset
        if self.idle:
            self.site.connections.busy(self)
        if self._silent:
            self._silent = False
            if self._head.due is not None:
                self._head.set(self.site.limits.head_timeout)
        elif self._head.due is None and not self._in_body and not handling_request(self):
            self._head.set(self.site.limits.head_timeout)
        _data_received(self, data)
        # A body that came whole with its head needs no timer; one still due gets one.
        if self._in_body and self._body_timer is None and not self._refused:
            self._body_timer = self.callLater(self.site.limits.body_timeout, self._body_too_slow)

    def headerReceived(self, line: bytes) -> bool:
        if admission.not_chunked(line):
            self.refuse(admission.NOT_CHUNKED)
            return False
        return bool(super().headerReceived(line))

    def requestDone(self, request: Any) -> None:
        super().requestDone(request)
        # Between requests, once nothing of the next one has come (pipelined bytes are
        # read by now): idle, until its next byte.
        if (
            self.persistent
            and not self.requests
            and self._head.due is None
            and not self._in_body
            and not self._refused
        ):
            self.site.connections.rest(self)

    def lineReceived(self, line: bytes) -> None:
        # A folded line would be joined to the header before by twisted.web: refused first.
        if admission.folded(line):
            self.refuse(admission.FOLDED)
            return
        _line_received(self, line)

    def allHeadersReceived(self) -> None:
        self._head.clear()
        self._in_body = True
        self.heads += 1
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        if self._refused:
            return  # never dispatched: the refusal was its answer
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().allContentReceived()

    def bad_request(self, too_large: bool = False) -> None:
        self.refuse(admission.HEAD_TOO_LARGE if too_large else admission.BAD_REQUEST)

    def refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` at once, outside twisted.web's request cycle (which has
        not begun, and for this request never will), then read nothing more.

        The body, if any, is neither read nor kept: the connection is half-closed and
        what the client still sends is drained, so that it reads the answer rather than
        a reset; a client that goes on sending is cut off after LINGER seconds.
        """
        if self._refused:
            return
        self._refused = True
        self.site.refused_requests[refusal.status, refusal.error] += 1
        if self.idle:
            self.site.connections.busy(self)
        self._in_body = False
        self._head.stop()
        stop(self._body_timer)
        self._body_timer = None
        if self.requests:
            self.requests[-1].refused()
        # What is left of the bytes at hand, and of a chunk being decoded, is dropped.
        self.setRawMode()
        self.rawDataReceived = _drop  # type: ignore[method-assign]
        method, target = request_line(self)
        transport: Any = self.transport
        path = target.partition(b"?")[0]
        transport.write(admission.answer(refusal, head_only=method == b"HEAD", path=path))
        if ITCPTransport.providedBy(transport):
            transport.loseWriteConnection()
        else:
            transport.loseConnection()
        self._linger = self.callLater(LINGER, transport.abortConnection)
        if refusal is admission.NO_REQUEST:
            return  # no request to log: it is counted
        self.site.observer.request_done(refused_record(refusal.status, method, path, refusal.error))

    def give_way(self) -> None:
        """Close this idle connection for a new one (the site has forgotten it): its
        client, if it comes back, reconnects. What it has still to read of its last
        answer is sent first, for up to twisted.web's ``abortTimeout``."""
        self._head.stop()
        transport: Any = self.transport
        transport.loseConnection()
        self._linger = self.callLater(self.abortTimeout or LINGER, transport.abortConnection)

    def setTimeout(self, period: float | None) -> float | None:
        """``TimeoutMixin.setTimeout``: the idle timeout, ``None`` for none; returns the
        one before."""
        before = self.timeOut
        self.timeOut = period  # type: ignore[assignment]  # typed int there; seconds are floats
        if period is None:
            self._idle.clear()
        else:
            self._idle.set(period)
        return before

    def resetTimeout(self) -> None:
        """``TimeoutMixin.resetTimeout``: a byte came, the idle timeout starts again
        (if it is on)."""
        if self._idle.due is not None and self.timeOut is not None:
            self._idle.set(self.timeOut)

    def answer_deadline(self, clock: IReactorTime) -> Deadline:
        """The deadline of the host's answer to the request under way, lent to its
        exchange (:func:`~crossbar.http.timers.borrow`): one for the connection's
        requests one after another, on ``clock`` (the proxy's)."""
        deadline = self._answer
        if deadline is None or deadline.clock is not clock:
            if deadline is not None:
                deadline.stop()
            deadline = self._answer = Deadline(clock, nothing)
            deadline.lender = self
        return deadline

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._head.stop()
        self._idle.stop()
        if self._answer is not None:
            self._answer.stop()
        stop(self._body_timer)
        stop(self._linger)
        self.site.connections.forget(self)
        super().connectionLost(reason)

    def _too_slow(self) -> None:
        self.refuse(admission.NO_REQUEST if self._silent else admission.HEAD_TOO_SLOW)

    def _body_too_slow(self) -> None:
        self._body_timer = None
        self.refuse(admission.BODY_TOO_SLOW)


# twisted.web's own, called without super(): both run for every line or read.
_line_received = http.HTTPChannel.lineReceived
_data_received = http.HTTPChannel.dataReceived


def _drop(data: bytes) -> None:
    pass


class _Closed(protocol.Protocol):
    """A connection past ``max_connections``: closed as soon as it is made. (Returning
    no protocol would do for a plain TCP port, not for one wrapped in TLS.)"""

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.loseConnection()


class Site(server.Site):
    """A Site whose requests are :class:`ProxyRequest` and that writes no access log
    of its own: the proxy logs one line per request when it really ends. Requests for
    any path but ``/_crossbar/`` go straight to ``proxy`` (see ProxyRequest.process).

    ``limits`` caps what clients may hold of it: open connections (at the cap the
    oldest idle one gives way to a new one; with none idle the new one is closed at
    once), those of one client (past its share a new one is closed at once), one body's
    size, the bodies held at once, the time a body may take. ``guard`` says who may come
    in, from a request's path and headers. ``observer`` is told of each request refused
    at the door (by default, the access log alone).
    """

    requestFactory = ProxyRequest
    noisy = False
    protocol = Channel  # type: ignore[assignment]  # plain HTTP/1.1, no HTTP/2 upgrade

    def __init__(
        self,
        resource: IResource,
        proxy: IResource | None = None,
        internal: bool = False,
        *,
        limits: Limits = DEFAULT_LIMITS,
        guard: Guard | None = None,
        observer: ProxyObserver | None = None,
        **kwargs: Any,
    ):
        super().__init__(resource, **kwargs)
        self.proxy = proxy
        self.observer: ProxyObserver = observer or AccessLog()
        self.limits = limits
        self.guard = guard
        self.draining = False
        """Stopping: see :func:`crossbar.http.admission.while_draining`."""
        self.connections = Connections(self.reactor)
        """The client connections open now, and the caps on them."""
        self.refused_requests: Counter[tuple[int, str]] = Counter()
        """Requests refused from their head, by status and error (a fixed set of words)."""
        self.body_memory = 0
        """Bytes of request bodies held now (announced lengths, chunks as they came)."""
        self._prefix = INTERNAL_LISTENER if internal else "crossbar"

    @property
    def channels(self) -> set[Channel]:
        """The client connections open now (closed one by one when crossbar stops)."""
        return self.connections.open

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        return len(self.connections.open)

    @property
    def refused_connections(self) -> int:
        """Client connections closed at once since start (see :class:`Connections`)."""
        return self.connections.refused

    @refused_connections.setter
    def refused_connections(self, count: int) -> None:
        self.connections.refused = count

    @property
    def closed_idle_connections(self) -> Mapping[str, int]:
        """Idle client connections closed since start to make room for new ones, by the
        limit reached (see :class:`Connections`)."""
        return self.connections.closed_idle

    def logPrefix(self) -> str:
        return self._prefix

    def log(self, request: Any) -> None:
        pass

    def buildProtocol(self, addr: IAddress | None) -> Any:
        admitted, client = self.connections.admit(addr, self.limits)
        if not admitted:
            return _Closed()
        channel = super().buildProtocol(addr)
        self.connections.add(channel, client)
        return channel

    def hold(self, size: int) -> Refusal | None:
        """Count ``size`` more bytes of body held, or say why not (413, 503)."""
        limits = self.limits
        if size > limits.max_body:
            return admission.TOO_LARGE
        if self.body_memory + size > limits.max_body_memory:
            return admission.BUSY
        self.body_memory += size
        return None

    def stopFactory(self) -> None:
        self.connections.stop()
        super().stopFactory()

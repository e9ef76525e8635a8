"""The proxy's HTTP/1.1 client for its hosts: kept-alive connections per host, one
request at a time on each.

Twisted's ``Agent`` does the same through layers a proxy does not need and that
cost about a third of crossbar's CPU per request: a URL parsed for every request, a
chain of Deferreds to write a body already in memory, a pause and a resume of every
pooled connection. Here the request goes out in one ``write`` (a large body in a second
one, never copied); the answer is read by :mod:`crossbar.upstream.connection`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint

from crossbar.upstream.call import Answerer, Call, Result
from crossbar.upstream.connection import IDLE, Connection, ConnectionFactory, Response
from crossbar.upstream.endpoints import IDLE_POOL_TIMEOUT, endpoint_for

BODY_APART = 64 * 1024
"""A body larger than this goes out as a write of its own after the head: joined to the
head it would be copied, 16 MiB more for a 16 MiB body."""


class Upstreams:
    """Sends requests to the configured hosts over kept-alive connections.

    Idle connections are reused newest first, closed after ``idle_timeout`` seconds
    (one timer for the whole pool), and at most ``max_idle`` are kept per host.
    ``tls_cas`` (host name -> PEM) are the CAs an ``https://`` host's certificate must
    chain to instead of the system's.
    """

    def __init__(
        self,
        reactor: Any,
        urls: Mapping[str, str],
        connect_timeouts: Mapping[str, float],
        max_idle: int = 64,
        idle_timeout: float = IDLE_POOL_TIMEOUT,
        clock: IReactorTime | None = None,
        tls_cas: Mapping[str, bytes] | None = None,
    ) -> None:
        self._clock: IReactorTime = clock or reactor
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._reactor = reactor
        self._endpoints: dict[str, IStreamClientEndpoint] = {}
        self._factories: dict[str, ConnectionFactory] = {}
        self._prefix: dict[str, bytes] = {}
        self._host_line: dict[str, bytes] = {}
        self._idle: dict[str, list[Connection]] = {}
        self._sweep: Any = None
        self._closed = False
        self.set_hosts(urls, connect_timeouts, tls_cas)

    def set_hosts(
        self,
        urls: Mapping[str, str],
        connect_timeouts: Mapping[str, float],
        tls_cas: Mapping[str, bytes] | None = None,
        fresh: Iterable[str] = (),
        keep: Iterable[str] = (),
    ) -> None:
        """Take a reloaded config's hosts. A host that stays keeps its idle connections
        (a new connect timeout applies to new ones); one in ``fresh`` has a new address:
        its idle connections are closed and those still answering are not pooled again.
        Hosts in ``keep`` left the config but still carry requests (see :meth:`drop`)."""
        fresh = set(fresh)
        for name, url in urls.items():
            ca = (tls_cas or {}).get(name)
            target = endpoint_for(self._reactor, url, connect_timeouts.get(name, 5.0), ca)
            self._endpoints[name] = target.endpoint
            self._prefix[name] = target.path.rstrip(b"/")
            self._host_line[name] = b"Host: " + target.authority + b"\r\n"
            if name in fresh or name not in self._factories:
                if name in self._idle:
                    self._expire(name, len(self._idle[name]))
                self._factories[name] = ConnectionFactory(self, name)
                self._idle[name] = []
        for name in [n for n in self._factories if n not in urls and n not in keep]:
            self.drop(name)

    def drop(self, name: str) -> None:
        """Forget a host that left the config: its idle connections are closed, and its
        connections still answering are closed when their answer ends."""
        if name in self._idle:
            self._expire(name, len(self._idle[name]))
        self._endpoints.pop(name, None)
        self._factories.pop(name, None)
        self._prefix.pop(name, None)
        self._host_line.pop(name, None)
        self._idle.pop(name, None)

    def request(
        self, host: str, method: bytes, path: bytes, headers: bytes, body: bytes | None
    ) -> Deferred[Response]:
        """:meth:`call`, started, its answer as a Deferred: it fires with the
        :class:`Response` once its headers are in; cancelling closes the connection."""
        result = Result()
        result.call = self.call(host, method, path, headers, body, result)
        result.call.start()
        return result.deferred

    def call(
        self,
        host: str,
        method: bytes,
        path: bytes,
        headers: bytes,
        body: bytes | None,
        to: Answerer,
    ) -> Call:
        """``method path`` for ``host`` (sent by the call's ``start``), its answer told to
        ``to``; ``headers`` are whole lines (``Name: value\\r\\n``), without ``Host`` and
        ``Content-Length``, which are added here."""
        head = [method, b" ", self._prefix[host], path, b" HTTP/1.1\r\n", self._host_line[host]]
        head.append(headers)
        head.append(b"\r\n" if body is None else b"Content-Length: %d\r\n\r\n" % len(body))
        data: tuple[bytes, ...]
        if body is not None and len(body) > BODY_APART:
            data = (b"".join(head), body)
        else:
            data = (b"".join([*head, body or b""]),)
        return Call(self, host, data, method == b"HEAD", to)

    # -- the pool -----------------------------------------------------------------------------

    def connect(self, host: str) -> Deferred[Connection]:
        d: Deferred[Any] = self._endpoints[host].connect(self._factories[host])
        return d

    def take(self, host: str) -> Connection | None:
        idle = self._idle[host]
        while idle:
            connection = idle.pop()
            if connection.idle_since <= self._clock.seconds() - self._idle_timeout:
                # Stale, and so is everything older beneath it.
                idle.append(connection)
                self._expire(host, len(idle))
                return None
            if connection.quiet():  # not closing, and nothing came since its last answer
                connection.reused = True
                return connection
        return None

    def release(self, connection: Connection) -> None:
        """A connection whose answer is complete: keep it for the next request."""
        if connection.state != IDLE:
            return
        idle = self._idle.get(connection.host)
        if idle is None or connection.origin is not self._factories[connection.host]:
            connection.abort()  # its host left the config or moved
            return
        if len(idle) >= self._max_idle or self._closed:
            connection.abort()
            return
        connection.idle_since = self._clock.seconds()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self._clock.callLater(self._idle_timeout, self._swept)

    def forget(self, connection: Connection) -> None:
        idle = self._idle.get(connection.host)
        if idle and connection in idle:
            idle.remove(connection)

    def _swept(self) -> None:
        self._sweep = None
        deadline = self._clock.seconds() - self._idle_timeout
        oldest = None
        for host, idle in self._idle.items():
            stale = sum(1 for c in idle if c.idle_since <= deadline)
            self._expire(host, stale)
            if idle and (oldest is None or idle[0].idle_since < oldest):
                oldest = idle[0].idle_since
        if oldest is not None:
            delay = max(oldest + self._idle_timeout - self._clock.seconds(), 0.01)
            self._sweep = self._clock.callLater(delay, self._swept)

    def _expire(self, host: str, count: int) -> list[Deferred[None]]:
        idle = self._idle[host]
        stale, idle[:count] = idle[:count], []
        return [connection.close() for connection in stale]

    def close(self) -> Deferred[Any]:
        """Close the idle connections and keep no more (crossbar is stopping)."""
        self._closed = True
        return self.drop_idle()

    def drop_idle(self) -> Deferred[Any]:
        """Close the idle connections; fires once they are closed (answers still
        streaming are left to finish or be cut off by their own side)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        closing = [d for host in self._idle for d in self._expire(host, len(self._idle[host]))]
        return DeferredList(closing)

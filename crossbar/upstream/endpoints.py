"""How crossbar connects to its hosts: an endpoint per host, and the poller's Agent.

Twisted's default endpoints resolve the host name in a thread for every new
connection, even for an IP address; llama-server routers close the connection
after every completion, so that cost would be paid on nearly every request. Here
an IP address is connected to directly, and each host gets its own connect timeout.
The proxy's requests use these endpoints through :mod:`crossbar.upstream.pool`; the health
poller uses treq over an ``Agent`` built here.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import attrs
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.ssl import optionsForClientTLS
from twisted.web.client import URI, Agent, HTTPConnectionPool
from twisted.web.iweb import IAgent, IAgentEndpointFactory
from zope.interface import implementer

from crossbar._twisted import QuietPool

IDLE_POOL_TIMEOUT = 3.0
"""Seconds an idle upstream connection is kept: llama-server drops them after 5 s,
and a POST sent on a connection the server is closing would fail."""


def _family(host: str) -> int | None:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family
    return None


def _endpoint(reactor: Any, scheme: bytes, host: str, port: int, timeout: float) -> Any:
    family = _family(host)
    endpoint: IStreamClientEndpoint
    if family == socket.AF_INET:
        endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
    elif family == socket.AF_INET6:
        endpoint = TCP6ClientEndpoint(reactor, host, port, timeout=timeout)
    else:
        endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout)
    if scheme == b"https":
        endpoint = wrapClientTLS(optionsForClientTLS(host), endpoint)
    return endpoint


@attrs.frozen
class HostAddress:
    """Where a host's base URL points: how to connect, and what to put in requests."""

    endpoint: IStreamClientEndpoint
    authority: bytes
    """The ``Host`` header's value: the port only when it is not the scheme's default."""
    path: bytes
    """The base URL's path, prefixed to every request's."""


def endpoint_for(reactor: Any, url: str, timeout: float) -> HostAddress:
    uri = URI.fromBytes(url.encode())
    host = uri.host.decode("ascii")
    authority = b"[%s]" % uri.host if _family(host) == socket.AF_INET6 else uri.host
    if uri.port != {b"http": 80, b"https": 443}.get(uri.scheme):
        authority += b":%d" % uri.port
    endpoint = _endpoint(reactor, uri.scheme, host, uri.port, timeout)
    return HostAddress(endpoint, authority, uri.path)


@implementer(IAgentEndpointFactory)
class HostEndpoints:
    """Endpoints for URIs: direct TCP for IP addresses, a per-host connect timeout."""

    def __init__(
        self, reactor: Any, timeouts: Mapping[tuple[bytes, int], float], default: float
    ) -> None:
        self._reactor = reactor
        self._timeouts = dict(timeouts)
        self._default = default

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        timeout = self._timeouts.get((uri.host, uri.port), self._default)
        endpoint: IStreamClientEndpoint = _endpoint(
            self._reactor, uri.scheme, uri.host.decode("ascii"), uri.port, timeout
        )
        return endpoint


def make_pool(reactor: Any, per_host: int) -> HTTPConnectionPool:
    pool = QuietPool(reactor, persistent=True)
    pool.maxPersistentPerHost = per_host
    pool.cachedConnectionTimeout = IDLE_POOL_TIMEOUT  # type: ignore[assignment]
    return pool


def make_agent(
    reactor: Any,
    pool: HTTPConnectionPool,
    urls: Mapping[str, str],
    connect_timeouts: Mapping[str, float],
    default_timeout: float = 5.0,
) -> IAgent:
    """An Agent for the given hosts (name -> base URL), with their connect timeouts."""
    timeouts = {}
    for name, url in urls.items():
        uri = URI.fromBytes(url.encode())
        timeouts[(uri.host, uri.port)] = connect_timeouts.get(name, default_timeout)
    endpoints = HostEndpoints(reactor, timeouts, default_timeout)
    agent: IAgent = Agent.usingEndpointFactory(reactor, endpoints, pool=pool)
    return agent

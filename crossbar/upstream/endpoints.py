"""How crossbar connects to its hosts: an endpoint per host, and the poller's Agent.

Twisted's default endpoints resolve the host name in a thread for every new
connection, even for an IP address; llama-server routers close the connection
after every completion, so that cost would be paid on nearly every request. Here
an IP address is connected to directly, and each host gets its own connect timeout.
An ``https://`` host's certificate is checked against the system's CAs, or against
the host's own ``tls_ca`` (a lab's CA), for requests and polls alike.
The proxy's requests use these endpoints through :mod:`crossbar.upstream.pool`; the health
poller uses treq over an ``Agent`` per host built here, which asks for no compression.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import attrs
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509 import load_pem_x509_certificates
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.ssl import Certificate, optionsForClientTLS, trustRootFromCertificates
from twisted.web.client import URI, Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from crossbar._twisted import QuietPool
from crossbar.upstream.failures import Discard
from crossbar.upstream.parsing import BadAnswer

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


TrustRoot = Any
"""What ``trustRootFromCertificates`` makes (its interface lives in a private module)."""


def trust_root(pem: bytes | None) -> TrustRoot | None:
    """What an ``https://`` host's certificate must chain to: the certificates of a
    ``tls_ca`` PEM file, or ``None`` for the system's CAs."""
    if pem is None:
        return None
    certificates = [
        Certificate.loadPEM(c.public_bytes(Encoding.PEM)) for c in load_pem_x509_certificates(pem)
    ]
    return trustRootFromCertificates(certificates)


def _endpoint(
    reactor: Any,
    scheme: bytes,
    host: str,
    port: int,
    timeout: float,
    trust: TrustRoot | None = None,
) -> Any:
    family = _family(host)
    endpoint: IStreamClientEndpoint
    if family == socket.AF_INET:
        endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
    elif family == socket.AF_INET6:
        endpoint = TCP6ClientEndpoint(reactor, host, port, timeout=timeout)
    else:
        endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout)
    if scheme == b"https":
        endpoint = wrapClientTLS(optionsForClientTLS(host, trustRoot=trust), endpoint)
    return endpoint


@attrs.frozen
class HostAddress:
    """Where a host's base URL points: how to connect, and what to put in requests."""

    endpoint: IStreamClientEndpoint
    authority: bytes
    """The ``Host`` header's value: the port only when it is not the scheme's default."""
    path: bytes
    """The base URL's path, prefixed to every request's."""


def endpoint_for(
    reactor: Any, url: str, timeout: float, tls_ca: bytes | None = None
) -> HostAddress:
    """How to reach the host at ``url``; ``tls_ca`` (PEM) replaces the system's CAs."""
    uri = URI.fromBytes(url.encode())
    host = uri.host.decode("ascii")
    authority = b"[%s]" % uri.host if _family(host) == socket.AF_INET6 else uri.host
    if uri.port != {b"http": 80, b"https": 443}.get(uri.scheme):
        authority += b":%d" % uri.port
    endpoint = _endpoint(reactor, uri.scheme, host, uri.port, timeout, trust_root(tls_ca))
    return HostAddress(endpoint, authority, uri.path)


@implementer(IAgentEndpointFactory)
class HostEndpoints:
    """Endpoints for URIs: direct TCP for IP addresses, a per-host connect timeout, and
    a per-host trust root for ``https://`` (by host and port; the system's CAs otherwise)."""

    def __init__(
        self,
        reactor: Any,
        timeouts: Mapping[tuple[bytes, int], float],
        default: float,
        trust: Mapping[tuple[bytes, int], TrustRoot] | None = None,
    ) -> None:
        self._reactor = reactor
        self._timeouts = dict(timeouts)
        self._default = default
        self._trust = dict(trust or {})

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        where = (uri.host, uri.port)
        timeout = self._timeouts.get(where, self._default)
        host = uri.host.decode("ascii")
        endpoint: IStreamClientEndpoint = _endpoint(
            self._reactor, uri.scheme, host, uri.port, timeout, self._trust.get(where)
        )
        return endpoint


_CODINGS = frozenset([b"gzip", b"x-gzip", b"deflate", b"br", b"zstd", b"compress"])


@implementer(IAgent)
class Uncompressed:
    """Asks for answers without compression, and refuses compressed ones unread.

    treq always asks for gzip and inflates what comes: a 1 MiB answer may inflate to
    1 GiB. Below treq's decoder, this replaces its ``Accept-Encoding`` with ``identity``
    and fails an answer that is content-encoded anyway, closing its connection before
    a byte of its body is read, so that nothing is ever inflated.
    """

    def __init__(self, agent: IAgent) -> None:
        self._agent = agent

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        headers = Headers() if headers is None else headers.copy()
        headers.setRawHeaders(b"Accept-Encoding", [b"identity"])
        d = self._agent.request(method, uri, headers, bodyProducer)
        return d.addCallback(_refuse_encoded)


def _refuse_encoded(response: IResponse) -> IResponse:
    values = response.headers.getRawHeaders(b"Content-Encoding") or []
    codings = [c.strip(b" \t").lower() for v in values for c in v.split(b",")]
    codings = [c for c in codings if c and c != b"identity"]
    if not codings:
        return response
    response.deliverBody(Discard())  # type: ignore[arg-type]
    named = codings[0].decode() if codings[0] in _CODINGS else "an unknown coding"
    raise BadAnswer(f"compressed ({named}) though no compression was asked for")


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
    tls_cas: Mapping[str, bytes] | None = None,
) -> IAgent:
    """An Agent for the given hosts (name -> base URL), with their connect timeouts and
    their own CAs (name -> PEM, for ``https://`` hosts that have one), that asks for
    answers without compression and refuses compressed ones."""
    timeouts = {}
    trust = {}
    for name, url in urls.items():
        uri = URI.fromBytes(url.encode())
        timeouts[(uri.host, uri.port)] = connect_timeouts.get(name, default_timeout)
        root = trust_root((tls_cas or {}).get(name))
        if root is not None:
            trust[(uri.host, uri.port)] = root
    endpoints = HostEndpoints(reactor, timeouts, default_timeout, trust)
    return Uncompressed(Agent.usingEndpointFactory(reactor, endpoints, pool=pool))


def make_agents(
    reactor: Any,
    pools: Mapping[str, HTTPConnectionPool],
    urls: Mapping[str, str],
    connect_timeouts: Mapping[str, float],
    default_timeout: float = 5.0,
    tls_cas: Mapping[str, bytes] | None = None,
) -> dict[str, IAgent]:
    """One :func:`make_agent` per host (name -> its Agent), each with its own pool from
    ``pools``: two hosts may share an address but not a CA, and a connection verified
    against one host's CA must never carry another host's request."""
    return {
        name: make_agent(
            reactor, pools[name], {name: url}, connect_timeouts, default_timeout, tls_cas
        )
        for name, url in urls.items()
    }

"""crossbar.upstream.endpoints: an IP address is connected to directly (no name lookup in a
thread), each host with its own connect timeout; the poller's pool and Agent."""

from __future__ import annotations

from typing import Any

import pytest
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.task import Clock
from twisted.web.client import URI
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IResponse
from zope.interface import implementer

from crossbar.upstream import describe
from crossbar.upstream.endpoints import (
    HostEndpoints,
    Uncompressed,
    make_agent,
    make_pool,
    trust_root,
)
from crossbar.upstream.parsing import BadAnswer
from tests.support import RecordingProducer
from tests.support.certs import self_signed_ca

CA_PEM = self_signed_ca()


def endpoints() -> HostEndpoints:
    from twisted.internet import reactor  # endpoints are only built here, nothing connects

    timeouts = {(b"10.0.0.11", 8080): 1.5, (b"::1", 8081): 2.5}
    return HostEndpoints(reactor, timeouts, default=5.0)


def test_ipv4_host_is_connected_directly_with_its_timeout() -> None:
    endpoint = endpoints().endpointForURI(URI.fromBytes(b"http://10.0.0.11:8080/v1/models"))
    assert isinstance(endpoint, TCP4ClientEndpoint)  # no name resolution in a thread
    assert endpoint._timeout == 1.5
    assert (endpoint._host, endpoint._port) == ("10.0.0.11", 8080)


def test_ipv6_host_is_connected_directly() -> None:
    endpoint = endpoints().endpointForURI(URI.fromBytes(b"http://[::1]:8081/health"))
    assert isinstance(endpoint, TCP6ClientEndpoint)
    assert endpoint._timeout == 2.5


def test_host_name_is_resolved_and_gets_the_default_timeout() -> None:
    endpoint = endpoints().endpointForURI(URI.fromBytes(b"http://gpu-a.lab:8080/health"))
    assert isinstance(endpoint, HostnameEndpoint)
    assert endpoint._timeout == 5.0


def test_https_is_wrapped_in_tls() -> None:
    endpoint = endpoints().endpointForURI(URI.fromBytes(b"https://10.0.0.11:8080/health"))
    assert not isinstance(endpoint, TCP4ClientEndpoint)
    assert isinstance(endpoint._wrappedEndpoint, TCP4ClientEndpoint)  # type: ignore[attr-defined]


def test_pool_keeps_idle_connections_shorter_than_llama_server() -> None:
    pool = make_pool(Clock(), per_host=8)
    assert pool.persistent and pool.maxPersistentPerHost == 8
    assert pool.cachedConnectionTimeout < 5  # llama-server closes idle ones after 5 s
    agent = make_agent(Clock(), pool, {"gpu-a": "http://10.0.0.11:8080"}, {"gpu-a": 1.5})
    assert agent is not None


# -- the poller's Agent asks for no compression, and refuses it -------------------------------


@implementer(IResponse)
class FakeResponse:
    """An answer whose body nobody has read yet; records what its reader did."""

    def __init__(self, headers: dict[bytes, list[bytes]]) -> None:
        self.code = 200
        self.phrase = b"OK"
        self.version = (b"HTTP", 1, 1)
        self.length = 1_000_000
        self.headers = Headers(headers)
        self.producer = RecordingProducer()
        self.read = False

    def deliverBody(self, protocol: Any) -> None:
        self.read = True
        protocol.makeConnection(self.producer)


@implementer(IAgent)
class FakeAgent:
    def __init__(self, response: FakeResponse) -> None:
        self.response = response
        self.sent: list[Headers] = []

    def request(
        self, method: bytes, uri: bytes, headers: Headers | None = None, bodyProducer: Any = None
    ) -> Deferred[IResponse]:
        assert headers is not None
        self.sent.append(headers)
        return succeed(self.response)  # type: ignore[arg-type]


def test_polls_ask_for_no_compression_in_place_of_treqs_gzip() -> None:
    agent = FakeAgent(FakeResponse({}))
    client = HTTPClient(Uncompressed(agent))
    d = client.get("http://10.0.0.11:8080/v1/models", headers={b"Authorization": [b"Bearer k"]})
    assert d.called
    (sent,) = agent.sent
    assert sent.getRawHeaders(b"accept-encoding") == [b"identity"]
    assert sent.getRawHeaders(b"authorization") == [b"Bearer k"]


@pytest.mark.parametrize(
    ("coding", "named"),
    [
        (b"gzip", "gzip"),
        (b"identity, GZIP", "gzip"),
        (b"br", "br"),
        (b"x-\x00evil\r\n", "an unknown coding"),
    ],
)
def test_a_compressed_answer_is_refused_unread_and_its_connection_closed(
    coding: bytes, named: str
) -> None:
    response = FakeResponse({b"Content-Encoding": [coding]})
    d = HTTPClient(Uncompressed(FakeAgent(response))).get("http://10.0.0.11:8080/health")
    failure = d.result
    d.addErrback(lambda _: None)
    assert isinstance(failure.value, BadAnswer)
    assert (
        describe(failure) == f"bad answer: compressed ({named}) though no compression was asked for"
    )
    assert response.producer.calls == ["stop"]  # the connection is closed, the body unread


@pytest.mark.parametrize("headers", [{}, {b"Content-Encoding": [b"identity"]}])
def test_an_uncompressed_answer_passes(headers: dict[bytes, list[bytes]]) -> None:
    response = FakeResponse(headers)
    d = Uncompressed(FakeAgent(response)).request(b"GET", b"http://10.0.0.11:8080/health")
    assert d.result is response
    assert not response.read


def test_make_agent_builds_an_uncompressed_agent_with_a_hosts_own_ca() -> None:
    from twisted.internet import reactor

    pool = make_pool(Clock(), per_host=1)
    urls = {"gpu-a": "https://10.0.0.11:8443", "gpu-b": "http://10.0.0.12:8080"}
    agent = make_agent(reactor, pool, urls, {}, tls_cas={"gpu-a": CA_PEM})
    assert isinstance(agent, Uncompressed)
    assert trust_root(None) is None
    assert trust_root(CA_PEM) is not None

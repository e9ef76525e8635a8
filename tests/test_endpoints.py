"""crossbar.upstream.endpoints: an IP address is connected to directly (no name lookup in a
thread), each host with its own connect timeout; the poller's pool and Agent."""

from __future__ import annotations

from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.task import Clock
from twisted.web.client import URI

from crossbar.upstream.endpoints import HostEndpoints, make_agent, make_pool


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

"""TLS on both sides of crossbar, over real loopback sockets, with throwaway certificates
made here (a lab CA, a host certificate it signed, and certificates that must fail).

- crossbar serves HTTPS when ``listen`` is an ``ssl:`` endpoint;
- an ``https://`` host is checked against its ``tls_ca``, or against the system's CAs,
  by the poller and by the proxy alike;
- a host whose certificate fails the check is down, and the reason says so in words.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
from cryptography import x509
from treq.client import HTTPClient
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.internet.ssl import Certificate, optionsForClientTLS, trustRootFromCertificates
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from crossbar.config import Config, HostConfig, RouteConfig
from crossbar.config.fields import parse_listen
from crossbar.config.model import WhenAllDown
from crossbar.service import Crossbar
from crossbar.testing import FAST, LogCapture, SimulatedHost, all_polled, guard, turns
from crossbar.testing.simulator.serving import QuietSite
from crossbar.upstream import Discard, Upstreams, describe
from tests.support import header
from tests.support.certs import certificate, key_pem, new_key, pem
from tests.support.errors import api_error

pytestmark = pytest.mark.filterwarnings(
    # Twisted's own server side of an ssl: endpoint hands pyOpenSSL its X509 objects.
    "ignore:Passing pyOpenSSL:DeprecationWarning"
)

CHAT = "/lab/v1/chat/completions"
BODY = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def reactor_() -> Any:
    from twisted.internet import reactor

    return reactor


# -- throwaway certificates -------------------------------------------------------------------


@attrs.frozen
class Pair:
    """A certificate and its key, written to files (as ``ssl:`` endpoints want them)."""

    cert: Path
    key: Path


@attrs.frozen
class Pki:
    ca: bytes
    """The lab CA's certificate (PEM): what a host's ``tls_ca`` holds."""
    ca_path: Path
    other_ca: bytes
    """The CA that signed ``stranger``."""
    good: Pair
    """For 127.0.0.1 and localhost, signed by the lab CA."""
    stranger: Pair
    """For 127.0.0.1, signed by a CA nobody trusts."""
    misnamed: Pair
    """Signed by the lab CA, but for another host's name."""


def _pair(folder: Path, name: str, cert: x509.Certificate, key: Any) -> Pair:
    (folder / f"{name}.pem").write_bytes(pem(cert))
    (folder / f"{name}.key").write_bytes(key_pem(key))
    return Pair(folder / f"{name}.pem", folder / f"{name}.key")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key = new_key()
    ca = certificate("crossbar test lab CA", ca_key, None, ca=True)
    other_key = new_key()
    other_ca = certificate("someone else's CA", other_key, None, ca=True)
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    keys = [new_key() for _ in range(3)]
    good = certificate("gpu-a", keys[0], (ca, ca_key), names=local)
    stranger = certificate("gpu-a", keys[1], (other_ca, other_key), names=local)
    misnamed = certificate("gpu-z", keys[2], (ca, ca_key), names=[x509.DNSName("gpu-z.lab")])
    (folder / "ca.pem").write_bytes(pem(ca))
    return Pki(
        pem(ca),
        folder / "ca.pem",
        pem(other_ca),
        _pair(folder, "good", good, keys[0]),
        _pair(folder, "stranger", stranger, keys[1]),
        _pair(folder, "misnamed", misnamed, keys[2]),
    )


def ssl_endpoint(pair: Pair) -> str:
    return f"ssl:0:interface=127.0.0.1:privateKey={pair.key}:certKey={pair.cert}"


# -- HTTPS hosts and crossbars ----------------------------------------------------------------


@attrs.define
class HttpsHost:
    sim: SimulatedHost
    port: IListeningPort

    @property
    def url(self) -> str:
        address: Any = self.port.getHost()
        return f"https://127.0.0.1:{address.port}"


@attrs.define
class Running:
    """What a test started, stopped at its end."""

    hosts: list[HttpsHost] = attrs.Factory(list)
    crossbars: list[Crossbar] = attrs.Factory(list)
    pools: list[HTTPConnectionPool] = attrs.Factory(list)
    logs: list[LogCapture] = attrs.Factory(list)

    async def https_host(self, pair: Pair) -> HttpsHost:
        """A simulated llama-server serving HTTPS with ``pair``."""
        sim = SimulatedHost()
        site = QuietSite(sim.resource, timeout=5)
        port = await serverFromString(reactor_(), ssl_endpoint(pair)).listen(site)
        host = HttpsHost(sim, port)
        self.hosts.append(host)
        return host

    async def crossbar(
        self,
        urls: dict[str, str],
        *,
        tls_ca: bytes | None = None,
        listen: str = "tcp:0:interface=127.0.0.1",
        when_all_down: WhenAllDown = "fail",
        wait: bool = True,
        without_ca: tuple[str, ...] = (),
    ) -> Crossbar:
        """``tls_ca`` for every ``https://`` host but those named in ``without_ca``."""
        config = Config(
            listen=parse_listen(listen),
            defaults=FAST,
            hosts={
                n: HostConfig(
                    n, u, tls_ca=tls_ca if u.startswith("https") and n not in without_ca else None
                )
                for n, u in urls.items()
            },
            routes={"lab": RouteConfig("lab", tuple(urls), "tiny-a", when_all_down=when_all_down)},
        )
        self.logs.append(LogCapture())
        crossbar = Crossbar(config, reactor_())
        crossbar.startService()
        self.crossbars.append(crossbar)
        await guard(crossbar.listener.listening, 5, "listening")
        if wait:
            await all_polled(crossbar.table, 5)
        return crossbar

    def client(self, trust: bytes | None = None) -> HTTPClient:
        """A client of crossbar; for HTTPS, one that trusts only the CA ``trust``."""
        pool = HTTPConnectionPool(reactor_(), persistent=False)
        self.pools.append(pool)
        if trust is None:
            return HTTPClient(Agent(reactor_(), pool=pool))
        return HTTPClient(Agent(reactor_(), pool=pool, contextFactory=TrustOnly(trust)))

    async def stop(self) -> None:
        for host in self.hosts:
            await host.port.stopListening()
        for crossbar in self.crossbars:
            await crossbar.stopService()
        for pool in self.pools:
            await pool.closeCachedConnections()
        for logs in self.logs:
            logs.close()
        await turns()


@implementer(IPolicyForHTTPS)
class TrustOnly:
    """A client's TLS policy that trusts one CA (as a client of crossbar's HTTPS would)."""

    def __init__(self, ca: bytes) -> None:
        self._trust = trustRootFromCertificates([Certificate.loadPEM(ca)])

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return optionsForClientTLS(hostname.decode(), trustRoot=self._trust)


@pytest_twisted.async_yield_fixture
async def running() -> AsyncIterator[Running]:
    run = Running()
    try:
        yield run
    finally:
        await run.stop()


def port_of(crossbar: Crossbar) -> int:
    assert crossbar.listener.port is not None
    address: Any = crossbar.listener.port.getHost()
    return int(address.port)


async def post(client: HTTPClient, url: str) -> tuple[int, dict[str, Any], Any]:
    response = await guard(client.post(url, json=BODY), 10)
    body = json.loads(await guard(treq.content(response), 10))
    return response.code, body, response


# -- crossbar's own port ----------------------------------------------------------------------


def test_an_ssl_listen_endpoint_is_accepted_as_written(pki: Pki) -> None:
    assert parse_listen(ssl_endpoint(pki.good)) == ssl_endpoint(pki.good)


@pytest_twisted.ensureDeferred
async def test_crossbar_serves_https_on_an_ssl_endpoint(running: Running, pki: Pki) -> None:
    """With ``listen: "ssl:0:privateKey=...:certKey=..."`` a client that trusts the lab's
    CA gets a proxied answer over HTTPS; the plain-HTTP host behind is polled as usual."""
    sim = SimulatedHost()
    await sim.listen(0, "127.0.0.1")
    try:
        crossbar = await running.crossbar({"gpu-a": sim.url}, listen=ssl_endpoint(pki.good))
        assert crossbar.table.get("gpu-a").healthy  # type: ignore[union-attr]
        base = f"https://127.0.0.1:{port_of(crossbar)}"
        code, body, response = await post(running.client(trust=pki.ca), base + CHAT)
        assert code == 200, body
        assert header(response, "x-crossbar-host") == "gpu-a"
        assert body["choices"][0]["message"]["content"]
        assert len(sim.requests) >= 3  # two polls and the completion
    finally:
        await sim.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_that_does_not_trust_crossbars_certificate_is_refused(
    running: Running, pki: Pki
) -> None:
    """The HTTPS port really is TLS with that certificate: a client trusting another CA
    fails the handshake (and crossbar keeps serving)."""
    crossbar = await running.crossbar(
        {"gpu-a": "http://127.0.0.1:9"}, listen=ssl_endpoint(pki.stranger), wait=False
    )
    base = f"https://127.0.0.1:{port_of(crossbar)}"
    with pytest.raises(Exception) as caught:
        await guard(running.client(trust=pki.ca).get(base + "/_crossbar/livez"), 10)
    assert describe(caught.value) == "TLS: certificate verify failed"
    response = await guard(running.client(trust=pki.other_ca).get(base + "/_crossbar/livez"), 10)
    assert response.code == 200
    await treq.content(response)


# -- https:// hosts ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_an_https_host_signed_by_its_tls_ca_is_polled_and_proxied(
    running: Running, pki: Pki
) -> None:
    host = await running.https_host(pki.good)
    crossbar = await running.crossbar({"gpu-a": host.url}, tls_ca=pki.ca)
    state = crossbar.table.get("gpu-a")
    assert state is not None and state.healthy, state
    assert state.loaded == ("tiny-a",)
    code, body, response = await post(
        running.client(), f"http://127.0.0.1:{port_of(crossbar)}" + CHAT
    )
    assert code == 200, body
    assert header(response, "x-crossbar-host") == "gpu-a"
    assert [r.path for r in host.sim.requests][-1] == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("which", "reason"),
    [
        ("stranger", "TLS: certificate verify failed"),
        ("misnamed", "TLS: the certificate is for another host name"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_host_whose_certificate_fails_is_down_saying_why(
    running: Running, pki: Pki, which: str, reason: str
) -> None:
    """Polled: down, with the reason in words. Proxied anyway (``when_all_down: try_all``):
    the client gets a 502 in JSON and the health table the same reason."""
    host = await running.https_host(getattr(pki, which))
    crossbar = await running.crossbar({"gpu-a": host.url}, tls_ca=pki.ca, when_all_down="try_all")
    state = crossbar.table.get("gpu-a")
    assert state is not None and not state.healthy
    assert state.last_err == f"health: {reason}"
    assert host.sim.requests == []  # nothing was said over the connection

    url = f"http://127.0.0.1:{port_of(crossbar)}" + CHAT
    code, body, _ = await post(running.client(), url)
    assert (code, body) == (502, api_error(502, "upstream failed (host gpu-a)"))
    state = crossbar.table.get("gpu-a")
    assert state is not None
    assert state.last_err == f"marked down: {reason}"
    assert host.sim.requests == []


@pytest_twisted.ensureDeferred
async def test_without_tls_ca_the_system_cas_decide(
    running: Running, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``tls_ca``: the system's CAs are asked, and they do not know the lab CA. (OpenSSL
    reads ``SSL_CERT_FILE`` for the system's CAs: pointed at the lab CA, the host passes.)"""
    host = await running.https_host(pki.good)
    crossbar = await running.crossbar({"gpu-a": host.url})
    state = crossbar.table.get("gpu-a")
    assert state is not None and state.last_err == "health: TLS: certificate verify failed"

    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_path))
    crossbar = await running.crossbar({"gpu-b": host.url})
    state = crossbar.table.get("gpu-b")
    assert state is not None and state.healthy, state


@pytest_twisted.ensureDeferred
async def test_a_host_is_polled_with_its_own_trust_not_that_of_another_at_its_address(
    running: Running, pki: Pki
) -> None:
    """Issue 27 (13): two names for one address, one with the lab CA and one without. The
    one without was polled with the other's CA and looked up, while every request to it
    failed verification. Each is polled with its own trust, on its own connections."""
    host = await running.https_host(pki.good)
    urls = {"gpu-a": host.url, "gpu-b": host.url}
    for order in (["gpu-a", "gpu-b"], ["gpu-b", "gpu-a"]):
        crossbar = await running.crossbar(
            {n: urls[n] for n in order}, tls_ca=pki.ca, without_ca=("gpu-b",)
        )
        for _ in range(2):  # and again, once a kept-alive poll connection could be reused
            await crossbar.hosts.poller.poll_now("gpu-a")
            await crossbar.hosts.poller.poll_now("gpu-b")
            a, b = crossbar.table.get("gpu-a"), crossbar.table.get("gpu-b")
            assert a is not None and a.healthy, a
            assert b is not None and not b.healthy
            assert b.last_err == "health: TLS: certificate verify failed"


@pytest_twisted.ensureDeferred
async def test_upstreams_check_the_certificate_against_the_hosts_own_ca(
    running: Running, pki: Pki
) -> None:
    """The proxy's own client: the lab CA given, the host's certificate passes; another
    host's CA given, it fails before a byte of the request is sent."""
    host = await running.https_host(pki.good)
    good = Upstreams(reactor_(), {"a": host.url}, {"a": 2.0}, tls_cas={"a": pki.ca})
    bad = Upstreams(reactor_(), {"a": host.url}, {"a": 2.0}, tls_cas={"a": pki.other_ca})
    try:
        response = await guard(good.request("a", b"GET", b"/health", b"", None), 5)
        assert response.code == 200
        response.deliverBody(Discard())
        with pytest.raises(Exception) as caught:
            await guard(bad.request("a", b"GET", b"/health", b"", None), 5)
        assert describe(caught.value) == "TLS: certificate verify failed"
        assert len(host.sim.requests) == 1
    finally:
        await good.close()
        await bad.close()

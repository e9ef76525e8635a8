"""crossbar.http.site: twisted.web fitted for the proxy.

Most of it is tested by feeding a request's raw bytes into a connection built by the
Site (:mod:`tests.support.doors`), over twisted's ``StringTransport`` and a ``Clock``: the door's
rules and how a refusal is answered, the guard, the body deadline, the connection and
body-memory caps (the dispatch and the body limits are in ``test_request.py``). A few
loopback tests show what a real client sees: a refused upload reads its answer and then
the end of the connection, one that keeps sending is cut off, a slow body gets a 408.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.address import IPv6Address
from twisted.internet.interfaces import ISSLTransport
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from zope.interface import directlyProvides

from crossbar.config import HostSettings, Limits
from crossbar.http import site as site_module
from crossbar.http.admission import RawHeaders, Refusal
from crossbar.http.site import Channel, Site
from crossbar.polling.health import HealthTable
from crossbar.queueing.traffic import Traffic
from crossbar.stats.metrics import Metrics
from crossbar.testing import LogCapture, eventually
from tests.support.doors import (
    CHAT,
    CHUNKED_HEAD,
    DEFAULTS,
    Conn,
    Door,
    Leaf,
    MiB,
    chunked,
    door,
    get,
    peer,
    post,
)
from tests.support.errors import api_error


@pytest.fixture
def d() -> Door:
    return door()


TYPE_400S = b'"type":"invalid_request_error","code":%d}}'


# -- the door's rules, as a client meets them -------------------------------------------------


def test_a_refusal_is_json_with_its_headers_and_ends_the_connection(d: Door) -> None:
    conn = d.connect()
    conn.send(get(b"/lab/v1/models", b"PUT"))
    status, headers, body = conn.refusal()
    assert status == 405 and body == api_error(405, "method not allowed")
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"allow"] == b"GET, HEAD, POST, DELETE, OPTIONS"
    assert headers[b"connection"] == b"close"
    assert conn.answer.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert conn.closed and d.rendered == []


@pytest.mark.parametrize(
    ("request_bytes", "error"),
    [
        (get(CHAT, extra=b"X-A: 1\r\n folded: yes\r\n"), "folded header line"),
        (get(CHAT, extra=b"X-A: 1\r\n\tfolded\r\n"), "folded header line"),
        (get(CHAT, extra=b"Host: b\r\n"), "more than one Host header"),
        (get(CHAT, extra=b"host: a\r\n"), "more than one Host header"),
        (b"GET /lab/v1/models HTTP/1.1\r\nX-A: 1\r\n\r\n", "no Host header"),
        (get(b"/lab/v1/../../admin"), "path with a . or .. segment"),
        (get(b"/lab/%2e%2E/other/v1/models"), "path with a . or .. segment"),
        (get(b"/lab/v1%2f..%2fadmin?x=1"), "path with a . or .. segment"),
        (b"POST /lab/x HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", ""),
        (post(extra=b"Transfer-Encoding: identity\r\n"), "Transfer-Encoding other than chunked"),
        (post(extra=b"Transfer-Encoding: IDENTITY\r\n"), "Transfer-Encoding other than chunked"),
        (
            get(CHAT, b"POST", b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n"),
            "Transfer-Encoding other than chunked",
        ),
        (
            get(CHAT, b"POST", b"Transfer-Encoding: chunked, chunked\r\n") + chunked(b"{}"),
            "Transfer-Encoding other than chunked",
        ),
        (b"POST /lab/x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", ""),
        (b"POST /lab/x HTTP/1.1\r\nContent-Length: -2\r\n\r\n{}", ""),
        (b"GET /lab/x HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", ""),
    ],
)
def test_what_the_door_or_twisted_s_parser_refuses_is_400_and_closed(
    d: Door, request_bytes: bytes, error: str
) -> None:
    conn = d.connect()
    conn.send(request_bytes)
    status, headers, body = conn.refusal()
    # twisted.web's own refusals (conflicting lengths, a NUL) come out in the same shape.
    assert (status, body) == (400, api_error(400, error or "bad request"))
    assert headers[b"connection"] == b"close" and conn.closed
    assert d.rendered == []


@pytest.mark.parametrize("coding", [b"chunked", b"Chunked", b" CHUNKED\t"])
def test_one_chunked_transfer_encoding_is_read(d: Door, coding: bytes) -> None:
    d.connect().send(CHUNKED_HEAD.replace(b" chunked", coding) + chunked(b"{", b"}"))
    [request] = d.proxy.rendered
    assert request.content.read() == b"{}"  # type: ignore[union-attr]


def test_a_header_line_over_16_kib_is_answered_431(d: Door) -> None:
    conn = d.connect()
    conn.send(get(CHAT, extra=b"X-Big: " + b"a" * 20_000 + b"\r\n"))
    status, headers, body = conn.refusal()
    assert (status, body) == (431, api_error(431, "request header line too long"))
    assert conn.answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert headers[b"connection"] == b"close" and conn.closed
    assert d.rendered == []


def test_an_http_1_0_request_may_leave_its_host_out(d: Door) -> None:
    conn = d.connect()
    conn.send(b"GET /lab/v1/models HTTP/1.0\r\n\r\n")
    assert len(d.rendered) == 1


FOLDED = post(extra=b"X-A: b\r\n c\r\n")
TWO_HOSTS = post(extra=b"X-A: b\r\nHost: b\r\n")
CLEAN = post(extra=b"X-A: b\r\nX-B:  c \r\n")


@pytest.mark.parametrize(("whole", "error"), [(FOLDED, "folded header line"), (TWO_HOSTS, None)])
def test_a_fold_or_two_hosts_are_found_however_the_bytes_are_split(
    whole: bytes, error: str | None
) -> None:
    expected = api_error(400, error or "more than one Host header")
    for cut in range(1, len(whole)):
        d = door()
        conn = d.connect()
        conn.send(whole[:cut])
        conn.send(whole[cut:])
        assert conn.refusal()[::2] == (400, expected), cut
        assert d.rendered == [], cut


def test_a_clean_request_passes_however_the_bytes_are_split() -> None:
    for cut in range(1, len(CLEAN)):
        d = door()
        conn = d.connect()
        conn.send(CLEAN[:cut])
        conn.send(CLEAN[cut:])
        [request] = d.proxy.rendered
        assert request.getHeader(b"x-b") == b"c" and conn.answer == b"", cut


def test_nothing_after_a_refused_head_is_read_not_even_the_next_request(d: Door) -> None:
    conn = d.connect()
    conn.send(get(CHAT, b"PUT", extra=b"Content-Length: 5\r\n") + b"12345" + get(CHAT))
    assert conn.refusal()[0] == 405
    conn.send(get(CHAT))
    assert d.rendered == [] and conn.answer.count(b"HTTP/1.1") == 1


def test_a_head_request_is_refused_without_a_body(d: Door) -> None:
    conn = d.connect()
    conn.send(get(b"/lab/../x", b"HEAD"))
    assert conn.answer.startswith(b"HTTP/1.1 400 ")
    assert conn.answer.endswith(b"\r\n\r\n")
    assert b"content-length: 93" in conn.answer.lower()  # the length a GET would get


def test_one_line_is_logged_for_a_refusal_without_the_query(d: Door) -> None:
    logs = LogCapture()
    try:
        d.connect().send(get(b"/lab/v1/models?key=secret", b"PUT"))
        d.connect().send(get(b"/lab/v1/\x1bmodels"))  # twisted.web refuses the line
    finally:
        logs.close()
    assert logs.matching("405") == ["- - PUT /lab/v1/models 405 0ms (method not allowed)"]
    assert logs.matching("400") == ["- - - - 400 0ms (bad request)"]
    assert not logs.matching("secret")


# -- the guard --------------------------------------------------------------------------------


@attrs.define
class RecordingGuard:
    """Refuses what ``refuse`` says, and records what it was shown."""

    refuse: Refusal | None = None
    seen: list[tuple[bytes, dict[bytes, list[bytes]]]] = attrs.Factory(list)

    def __call__(self, path: bytes, headers: RawHeaders) -> Refusal | None:
        self.seen.append((path, {name.lower(): list(values) for name, values in headers}))
        return self.refuse


UNAUTHORIZED = Refusal(401, "unauthorized", ((b"WWW-Authenticate", b"Bearer"),), close=True)


def test_the_guard_sees_the_path_without_query_and_the_headers() -> None:
    guard = RecordingGuard()
    d = door(guard=guard)
    d.connect().send(post(CHAT + b"?key=x", extra=b"Authorization: Bearer k\r\n"))
    [(path, headers)] = guard.seen
    assert path == CHAT
    assert headers[b"authorization"] == [b"Bearer k"] and headers[b"host"] == [b"a"]
    assert len(d.proxy.rendered) == 1


def test_the_guard_s_refusal_is_answered_and_its_body_never_invited() -> None:
    guard = RecordingGuard(UNAUTHORIZED)
    d = door(guard=guard)
    conn = d.connect()
    conn.send(post(body=b"x" * 100, extra=b"Expect: 100-continue\r\n")[:-100])
    status, headers, body = conn.refusal()
    assert (status, body) == (401, api_error(401, "unauthorized"))
    assert headers[b"www-authenticate"] == b"Bearer"
    assert b"100 Continue" not in conn.answer and conn.closed


def test_the_door_s_rules_come_before_the_guard_and_the_guard_before_the_limits() -> None:
    guard = RecordingGuard(UNAUTHORIZED)
    d = door(Limits(max_body=10), guard)
    conn = d.connect()
    conn.send(get(CHAT, b"PUT"))
    assert conn.refusal()[0] == 405 and guard.seen == []
    conn = d.connect()
    conn.send(post(body=b"x" * 11))
    assert conn.refusal()[0] == 401


def test_an_admitted_body_is_invited_once(d: Door) -> None:
    conn = d.connect()
    conn.send(post(body=b"{}", extra=b"Expect: 100-continue\r\n")[:-2])
    assert conn.answer == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.send(b"{}")
    assert len(d.proxy.rendered) == 1


# -- the body deadline ------------------------------------------------------------------------


def test_a_body_not_complete_in_body_timeout_after_the_head_is_408() -> None:
    d = door(Limits(body_timeout=60))
    conn = d.connect()
    conn.send(post(body=b"x" * 10)[:-5])
    d.clock.advance(59)
    conn.send(b"xx")  # bytes arriving do not start the deadline again
    assert conn.answer == b""
    d.clock.advance(1)
    assert conn.refusal()[::2] == (408, api_error(408, "request body too slow"))
    assert conn.closed and d.rendered == [] and d.site.body_memory == 0


def test_a_body_complete_in_time_is_not_timed_out_later() -> None:
    d = door(Limits(body_timeout=60))
    conn = d.connect()
    conn.send(CHUNKED_HEAD + chunked(b"x", end=False))
    d.clock.advance(59)
    conn.send(chunked(b"y"))
    assert len(d.proxy.rendered) == 1
    assert d.clock.getDelayedCalls() == []
    d.clock.advance(3600)
    assert conn.answer == b""


@pytest.mark.parametrize(
    "whole",
    [get(CHAT), post(body=b"x" * 1000), CHUNKED_HEAD + chunked(b"x" * 100, b"y")],
    ids=["bodyless", "length", "chunked"],
)
def test_a_body_that_comes_with_its_head_gets_no_timer(d: Door, whole: bytes) -> None:
    conn = d.connect()
    conn.send(whole)
    assert len(d.proxy.rendered) == 1
    assert d.clock.scheduled == 1  # the connection's deadline (first byte, then head), alone
    d.clock.advance(3600)  # it lapses: the head has come, and no body is due
    assert conn.answer == b"" and not conn.closed
    assert d.clock.getDelayedCalls() == []


# -- open connections -------------------------------------------------------------------------


def refused_connection(d: Door, host: str = "127.0.0.9") -> StringTransport:
    transport = StringTransport()
    closing = d.site.buildProtocol(peer(host))
    assert closing is not None and not isinstance(closing, Channel)
    closing.makeConnection(transport)
    return transport


def busy(d: Door, host: str) -> Conn:
    """A connection from ``host`` with a request under way (the proxy never answers)."""
    conn = d.connect(peer(host))
    conn.send(get(CHAT))
    return conn


def answered(d: Door, conn: Conn) -> None:
    """Answer the connection's request: it is kept alive, idle."""
    [request] = [r for r in d.rendered if r.channel is conn.channel]
    request.finish()
    assert not conn.closed


def test_connections_past_max_connections_are_closed_at_once_and_counted() -> None:
    d = door(Limits(max_connections=2))
    first, second = busy(d, "127.0.0.2"), busy(d, "127.0.0.3")
    refused = refused_connection(d)
    assert refused.disconnecting and refused.value() == b""
    assert (d.site.open_connections, d.site.refused_connections) == (2, 1)
    first.channel.connectionLost(Failure(ConnectionError()))
    third = busy(d, "127.0.0.4")
    assert len(d.proxy.rendered) == 3
    assert (d.site.open_connections, d.site.refused_connections) == (2, 1)
    second.channel.connectionLost(Failure(ConnectionError()))
    third.channel.connectionLost(Failure(ConnectionError()))
    assert d.site.open_connections == 0


def test_refused_connections_are_logged_once_per_burst_with_how_many() -> None:
    d = door(Limits(max_connections=1))
    busy(d, "127.0.0.2")
    logs = LogCapture()
    try:
        for _ in range(5):
            refused_connection(d)
        d.clock.advance(9)
        refused_connection(d)
        d.clock.advance(1)
        d.clock.advance(10)
        d.clock.advance(60)
    finally:
        logs.close()
    assert logs.matching("refused") == [
        "refused 1 client connection: 1 open, the max_connections limit",
        "refused 5 client connections: 1 open, the max_connections limit",
    ]
    assert d.clock.getDelayedCalls() == []


def test_the_connections_are_in_the_metrics() -> None:
    d = door(Limits(max_connections=2))
    table = HealthTable({"gpu-a": "http://127.0.0.1:1"}, Clock(), {"gpu-a": HostSettings()})
    metrics = Metrics(table, Traffic(["gpu-a"], ["lab"]))
    metrics.count_connections(d.site)
    first, second = d.connect(peer("127.0.0.2")), d.connect(peer("127.0.0.3"))
    first.send(b"TRACE /lab/v1/models HTTP/1.1\r\nHost: a\r\n\r\n")
    second.send(post(extra=b"Host: b\r\n"))
    refused_connection(d)
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }
    assert found["crossbar_connections_refused_total", ()] == 1
    assert found["crossbar_client_connections", ()] == 2
    closed = "crossbar_connections_closed_idle_total"
    assert found[closed, (("limit", "max_connections"),)] == 0
    assert found[closed, (("limit", "max_connections_per_client"),)] == 0
    refused = "crossbar_requests_refused_total"
    assert found[refused, (("code", "405"), ("reason", "method not allowed"))] == 1
    assert found[refused, (("code", "400"), ("reason", "more than one Host header"))] == 1


# -- silent connections, a client's share, idle connections giving way ------------------------


def test_a_new_connection_that_sends_nothing_is_answered_408_after_head_timeout() -> None:
    d = door(Limits(head_timeout=30), timeout=75)
    conn = d.connect()
    logs = LogCapture()
    try:
        d.clock.advance(29.9)
        assert conn.answer == b"" and not conn.closed
        d.clock.advance(0.1)
    finally:
        logs.close()
    assert conn.refusal()[::2] == (408, api_error(408, "no request sent"))
    assert conn.closed and d.rendered == []
    assert d.site.refused_requests == {(408, "no request sent"): 1}
    assert logs.lines == []  # no request, no access line: the metrics count it


def test_the_first_byte_starts_the_head_s_own_deadline() -> None:
    d = door(Limits(head_timeout=30))
    conn = d.connect()
    d.clock.advance(20)
    conn.send(b"GET /lab/v1/mo")
    d.clock.advance(29)
    assert conn.answer == b""
    d.clock.advance(1)
    assert conn.refusal()[::2] == (408, api_error(408, "request head too slow"))


def test_between_requests_a_kept_alive_connection_waits_for_the_idle_timeout() -> None:
    d = door(Limits(head_timeout=30), timeout=75)
    conn = busy(d, "127.0.0.1")
    answered(d, conn)
    sent = conn.answer
    d.clock.advance(74)
    assert not conn.closed and conn.answer == sent  # not the head's 30 s
    d.clock.advance(1)
    assert conn.closed and conn.answer == sent  # the site's idle timeout, as before


def test_a_client_address_holds_at_most_its_share_of_the_connections() -> None:
    d = door(Limits(max_connections=8))  # a share of 2
    assert d.site.limits.max_connections_per_client == 2
    held = [busy(d, "127.0.0.2") for _ in range(2)]
    logs = LogCapture()
    try:
        refused = [refused_connection(d, "127.0.0.2") for _ in range(3)]
        d.clock.advance(10)
    finally:
        logs.close()
    assert all(t.disconnecting and t.value() == b"" for t in refused)
    assert not any(conn.closed for conn in held)
    assert d.site.refused_connections == 3
    assert logs.matching("refused") == [
        "refused 1 client connection from 127.0.0.2: 2 open from each,"
        " the max_connections_per_client limit",
        "refused 2 client connections from 127.0.0.2: 2 open from each,"
        " the max_connections_per_client limit",
    ]
    d.connect(peer("127.0.0.3"))  # another address is let in
    held[0].channel.connectionLost(Failure(ConnectionError()))
    d.connect(peer("127.0.0.2"))  # a place of its share is free again


def test_at_its_share_a_client_s_own_oldest_idle_connection_gives_way() -> None:
    d = door(Limits(max_connections=8))  # a share of 2
    other = d.connect(peer("127.0.0.3"))  # idle, and older: another client's, kept
    silent = [d.connect(peer("127.0.0.2")) for _ in range(2)]
    d.connect(peer("127.0.0.2"))
    assert silent[0].closed and silent[0].answer == b""
    assert not silent[1].closed and not other.closed
    assert (d.site.open_connections, d.site.refused_connections) == (3, 0)


def test_idle_connections_closed_for_room_are_in_the_metrics_by_limit() -> None:
    d = door(Limits(max_connections=4))  # a share of 1
    table = HealthTable({"gpu-a": "http://127.0.0.1:1"}, Clock(), {"gpu-a": HostSettings()})
    metrics = Metrics(table, Traffic(["gpu-a"], ["lab"]))
    metrics.count_connections(d.site)
    first, second = d.connect(peer("127.0.0.2")), d.connect(peer("127.0.0.2"))
    assert first.closed and not second.closed  # its client's share: the first gave way
    others = [d.connect(peer(f"127.0.0.{n}")) for n in (3, 4, 5, 6)]
    assert second.closed  # the whole cap: the oldest idle one gave way
    assert not any(conn.closed for conn in others)
    found = {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
        if sample.name == "crossbar_connections_closed_idle_total"
    }
    assert found == {
        (("limit", "max_connections"),): 1,
        (("limit", "max_connections_per_client"),): 1,
    }


def test_trusted_proxies_have_no_share() -> None:
    proxies = (ipaddress.ip_network("127.0.0.2"),)
    d = door(attrs.evolve(Limits(max_connections=8), trusted_proxies=proxies))
    held = [d.connect(peer("127.0.0.2")) for _ in range(8)]
    assert d.site.open_connections == 8 and d.site.refused_connections == 0
    assert not any(conn.closed for conn in held)


def test_an_ipv6_client_s_share_is_its_64() -> None:
    d = door(Limits(max_connections=4))  # a share of 1
    one = IPv6Address("TCP", "2001:db8:1:2::1", 40000)
    same_64 = IPv6Address("TCP", "2001:db8:1:2:ffff::9", 40000)
    other_64 = IPv6Address("TCP", "2001:db8:1:3::1", 40000)
    d.connect(one).send(get(CHAT))
    assert not isinstance(d.site.buildProtocol(same_64), Channel)
    d.connect(other_64)


def test_at_the_cap_the_oldest_idle_connection_gives_way_to_a_new_one() -> None:
    d = door(Limits(max_connections=3))  # each client below from an address of its own
    silent = d.connect(peer("127.0.0.2"))  # never sends a byte
    working = busy(d, "127.0.0.3")  # its request under way
    kept = busy(d, "127.0.0.4")
    answered(d, kept)  # idle since its answer, newer than the silent one
    logs = LogCapture()
    try:
        first = d.connect(peer("127.0.0.5"))
        assert silent.closed and silent.answer == b""  # closed quietly, not answered
        assert not kept.closed
        second = d.connect(peer("127.0.0.6"))
        assert kept.closed and not working.closed
        assert d.site.open_connections == 3 and d.site.refused_connections == 0
        first.send(b"GET /lab/v1/mo")  # a head under way is no idle connection
        second.send(get(CHAT))
        refused = refused_connection(d, "127.0.0.7")
        d.clock.advance(10)
    finally:
        logs.close()
    assert refused.disconnecting and d.site.refused_connections == 1
    assert not (first.closed or second.closed or working.closed)
    closed = "idle client connection to make room for new ones: 3 open, the max_connections limit"
    assert logs.matching("connection") == [
        f"closed 1 {closed}",
        "refused 1 client connection: 3 open, the max_connections limit",
        f"closed 1 {closed}",
    ]


# -- over real sockets ------------------------------------------------------------------------


@attrs.define
class Served:
    site: Site
    proxy: Leaf
    port: Any

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port.getHost().port)


@pytest_twisted.async_yield_fixture
async def served(reactor: Any, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    limits = getattr(request, "param", DEFAULTS)
    proxy = Leaf()
    site = Site(Resource(), proxy=proxy, limits=limits, timeout=None)
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    yield Served(site, proxy, port)
    await port.stopListening()
    for request_ in proxy.rendered:
        request_.transport.abortConnection()  # type: ignore[union-attr]
    await eventually(lambda: site.open_connections == 0, what="every connection closed")


@pytest.fixture
def short_linger(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(site_module, "LINGER", 0.3)
    yield


def read_to_end(s: socket.socket) -> bytes:
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    return answer


def upload_then_read(address: tuple[str, int], data: bytes) -> tuple[bytes, bool]:
    """Send all of ``data``, then read to the end; whether all of it could be sent."""
    with socket.create_connection(address, timeout=10) as s:
        try:
            s.sendall(data)
            sent = True
        except OSError:
            sent = False
        try:
            return read_to_end(s), sent
        except ConnectionResetError:
            return b"", sent


@pytest_twisted.ensureDeferred
async def test_a_client_that_sends_a_refused_upload_reads_its_answer(
    served: Served,
) -> None:
    head = get(CHAT, b"PUT", extra=b"Content-Length: %d\r\n" % (10 * MiB))
    answer, sent = await deferToThread(upload_then_read, served.address, head + b"x" * 10 * MiB)
    assert sent and answer.startswith(b"HTTP/1.1 405 ")
    assert answer.endswith(b'{"error":{"message":"method not allowed",' + TYPE_400S % 405)
    assert served.site.body_memory == 0 and served.proxy.rendered == []


@pytest_twisted.ensureDeferred
async def test_twisted_s_own_400_closes_the_connection(served: Served) -> None:
    bad = b"POST /lab/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    answer, _ = await deferToThread(upload_then_read, served.address, bad + get(CHAT))
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.endswith(
        b'{"error":{"message":"bad request",' + TYPE_400S % 400
    )
    assert served.proxy.rendered == []


def keep_sending(address: tuple[str, int], head: bytes) -> tuple[bytes, float]:
    """Send a refused head, then junk until the connection is cut; what came back, and
    how long it took."""
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(head)
        started = time.monotonic()
        answer = b""
        s.setblocking(False)
        while True:
            try:
                s.send(b"x" * 4096)
            except BlockingIOError:
                pass
            except OSError:
                return answer, time.monotonic() - started
            try:
                answer += s.recv(65536)
            except BlockingIOError:
                pass
            except OSError:
                return answer, time.monotonic() - started
            time.sleep(0.001)
            if time.monotonic() - started > 5:
                return answer, 5.0


@pytest_twisted.ensureDeferred
async def test_a_client_that_goes_on_sending_is_cut_off_after_the_linger(
    served: Served, short_linger: None
) -> None:
    head = post(body=b"", extra=b"Host: b\r\nContent-Length: 1000000000\r\n")
    answer, seconds = await deferToThread(keep_sending, served.address, head)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert 0.25 < seconds < 2


def slow_body(address: tuple[str, int]) -> tuple[bytes, float]:
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(post(body=b"x" * 10)[:-5])
        started = time.monotonic()
        return read_to_end(s), time.monotonic() - started


@pytest.mark.parametrize("served", [Limits(body_timeout=0.3)], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_slow_body_is_answered_408_and_closed(served: Served) -> None:
    answer, seconds = await deferToThread(slow_body, served.address)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b'{"error":{"message":"request body too slow",' + TYPE_400S % 408)
    assert 0.25 < seconds < 2


def one_too_many(address: tuple[str, int], source: str = "127.0.0.2") -> bytes:
    """A request from ``source`` (loopback takes any 127.0.0.x as a client's address)."""
    with socket.create_connection(address, timeout=10, source_address=(source, 0)) as s:
        s.sendall(get(CHAT))
        try:
            return read_to_end(s)
        except ConnectionResetError:
            return b""


@pytest.mark.parametrize("served", [Limits(max_connections=1)], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_connection_past_the_cap_is_closed_at_once(served: Served) -> None:
    logs = LogCapture()
    try:
        with socket.create_connection(served.address, timeout=10) as held:
            held.sendall(get(CHAT))  # a request under way: it does not give way
            await eventually(lambda: len(served.proxy.rendered) == 1)
            answer = await deferToThread(one_too_many, served.address)
            assert answer == b"" and served.site.refused_connections == 1
            served.proxy.rendered.pop().finish()
        await eventually(lambda: served.site.open_connections == 0)
    finally:
        logs.close()
    assert logs.matching("refused 1 client connection: 1 open, the max_connections limit")


def silent_then_asked(address: tuple[str, int]) -> tuple[bytes, float]:
    """A connection that sends nothing: what it reads, and when."""
    with socket.create_connection(address, timeout=10) as s:
        started = time.monotonic()
        return read_to_end(s), time.monotonic() - started


@pytest.mark.parametrize("served", [Limits(head_timeout=0.3)], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_silent_connection_is_answered_408_after_head_timeout(served: Served) -> None:
    answer, seconds = await deferToThread(silent_then_asked, served.address)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b'{"error":{"message":"no request sent",' + TYPE_400S % 408)
    assert 0.25 < seconds < 2


@pytest.mark.parametrize("served", [Limits(max_connections=2)], indirect=True)
@pytest_twisted.ensureDeferred
async def test_at_the_cap_a_silent_connection_gives_way_to_a_client(served: Served) -> None:
    address = served.address
    with (
        socket.create_connection(address, timeout=10) as silent,
        socket.create_connection(address, timeout=10, source_address=("127.0.0.3", 0)) as other,
    ):
        await eventually(lambda: served.site.open_connections == 2)
        with socket.create_connection(address, timeout=10, source_address=("127.0.0.2", 0)) as new:
            new.sendall(get(CHAT))
            await eventually(lambda: len(served.proxy.rendered) == 1)
            assert await deferToThread(silent.recv, 10) == b""  # the oldest idle one: closed
            other.setblocking(False)
            with pytest.raises(BlockingIOError):
                other.recv(10)  # the newer one: still open
            assert served.site.refused_connections == 0
            served.proxy.rendered.pop().finish()


@pytest.mark.parametrize("served", [Limits(max_connections=1)], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_connection_whose_request_came_with_it_does_not_give_way(served: Served) -> None:
    """Twisted accepts every connection waiting before it reads any: one whose request
    is already there is not taken for a silent one by the connections after it."""
    address = served.address
    with socket.create_connection(address, timeout=10) as asking:
        asking.sendall(get(CHAT))  # before crossbar has accepted it
        with socket.create_connection(address, timeout=10, source_address=("127.0.0.2", 0)) as late:
            answer = await deferToThread(read_to_end, late)
            assert answer == b"" and served.site.refused_connections == 1
        await eventually(lambda: len(served.proxy.rendered) == 1)
        served.proxy.rendered.pop().finish()


def test_a_connection_is_secure_only_over_tls_and_asked_once(d: Door) -> None:
    """The client's scheme (``X-Forwarded-Proto``) is the connection's: TLS or not."""
    plain, tls = d.connect(), d.connect()
    directlyProvides(tls.transport, ISSLTransport)
    assert (plain.channel.isSecure(), tls.channel.isSecure()) == (False, True)
    directlyProvides(tls.transport)  # the answer is the connection's, kept
    assert tls.channel.isSecure()

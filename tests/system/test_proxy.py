"""The proxy end to end over real loopback sockets: crossbar in front of scripted upstreams."""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.web import server
from twisted.web.resource import Resource

from crossbar.config import HostSettings, Limits, RouteConfig
from crossbar.polling.health import HealthTable
from crossbar.service import Crossbar
from tests import support
from tests.support import header
from tests.support.errors import api_error

DOWN = "gpu-a down (marked down: test), gpu-b down (marked down: test)"
"""How a 503 names the two hosts a test marked down."""

Handler = Callable[[server.Request], Any]
MAX_BODY = Limits().max_body


class Upstream(Resource):
    """A scripted llama-server: /health, /v1/models, and an echo of what it was sent."""

    isLeaf = True

    def __init__(self, loaded: tuple[str, ...] = ("m1",)) -> None:
        super().__init__()
        self.loaded = loaded
        self.seen: list[dict[str, Any]] = []
        self.handler: Handler | None = None
        self.port: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"

    def render(self, request: server.Request) -> Any:
        assert request.uri is not None and request.content is not None
        if request.uri == b"/health":
            return b'{"status":"ok"}'
        if request.uri == b"/v1/models":
            data = [{"id": m, "status": {"value": "loaded"}} for m in self.loaded]
            return json.dumps({"data": data, "object": "list"}).encode()
        if request.uri.startswith(b"/props"):  # the poller asking for slots or room: none said
            request.setResponseCode(404)
            return b'{"error":"not here"}'
        headers = {
            k.decode().lower(): [v.decode() for v in vs]
            for k, vs in request.requestHeaders.getAllRawHeaders()
        }
        seen = {
            "method": request.method.decode(),
            "uri": request.uri.decode(),
            "headers": headers,
            "body": request.content.read().decode(),
        }
        self.seen.append(seen)
        if self.handler is not None:
            return self.handler(request)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"x-upstream", b"yes")
        return json.dumps(seen).encode()


def site(upstream: Upstream) -> server.Site:
    return server.Site(upstream, timeout=None)


@attrs.define
class Rig:
    """crossbar (built with crossbar.testing's rig) in front of two echoing upstreams."""

    built: support.Rig
    upstreams: dict[str, Upstream]

    @property
    def crossbar(self) -> Crossbar:
        return self.built.crossbar

    @property
    def table(self) -> HealthTable:
        return self.built.crossbar.table

    @property
    def base(self) -> str:
        return self.built.base

    @property
    def client(self) -> HTTPClient:
        return self.built.client


@pytest_twisted.async_yield_fixture
async def rig(reactor: Any) -> AsyncIterator[Rig]:
    upstreams = {"gpu-a": Upstream(("m1",)), "gpu-b": Upstream(("m2",))}
    for upstream in upstreams.values():
        upstream.port = reactor.listenTCP(0, site(upstream), interface="127.0.0.1")
    built = await support.build(
        {n: u.url + "/" for n, u in upstreams.items()},
        routes={
            "lab": RouteConfig("lab", ("gpu-a", "gpu-b"), "m1"),
            "nodefault": RouteConfig("nodefault", ("gpu-b",), None),
            "all": RouteConfig("all", ("gpu-a", "gpu-b"), None, list_models="merged"),
        },
        defaults=HostSettings(poll_interval=60.0),
        up=("gpu-a", "gpu-b"),
    )
    yield Rig(built, upstreams)
    await support.teardown(built)
    for upstream in upstreams.values():
        if upstream.port.connected:
            await upstream.port.stopListening()


async def call(rig: Rig, method: str, path: str, **kwargs: Any) -> tuple[Any, bytes]:
    response = await rig.client.request(method, rig.base + path, **kwargs)
    body = await treq.content(response)
    return response, body


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/", 400, "missing route"),
        ("//v1/models", 400, "missing route"),
        ("/nope/v1/models", 404, "unknown route"),
        ("/lab/slots", 404, "not found"),
        ("/lab/metrics", 404, "not found"),
        ("/lab", 404, "not found"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_error_answers_are_json(rig: Rig, path: str, status: int, error: str) -> None:
    response, body = await call(rig, "GET", path)
    assert response.code == status
    assert header(response, "content-type") == "application/json"
    assert json.loads(body) == api_error(status, error)
    assert all(not u.seen for u in rig.upstreams.values())


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/opencdoe/v1/chat/completions?key=1", "- - POST /opencdoe/v1/chat/completions 404"),
        ("/lab/v1x/chat?key=1", "lab - POST /v1x/chat 404"),
        ("/%00%ff/v1/models", "- - POST /%00%ff/v1/models 404"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_request_that_is_not_proxied_is_logged_as_asked(
    rig: Rig, path: str, logged: str
) -> None:
    """An admin looking for a misconfigured agent finds the route it asked for (the
    query is left out: it may carry a key)."""
    response, _ = await call(rig, "POST", path, data=b"{}")
    assert response.code == 404
    assert rig.built.logs.matching(logged), rig.built.logs.lines


@pytest_twisted.ensureDeferred
async def test_requests_are_counted_by_the_model_their_body_asks_for(rig: Rig) -> None:
    """A body naming a model counts for it, one naming none for the route's default it was
    given; a request with no model in it (listing the models) counts for none."""
    await call(rig, "POST", "/lab/v1/chat/completions", data=b'{"model": "m2"}')
    await call(rig, "POST", "/lab/v1/chat/completions", data=b'{"messages": []}')
    await call(rig, "GET", "/lab/v1/models")
    text = rig.crossbar.metrics.render().decode()
    counted = [line for line in text.splitlines() if line.startswith("crossbar_model_requests")]
    assert sorted(counted) == [
        'crossbar_model_requests_total{model="m1",route="lab"} 1.0',
        'crossbar_model_requests_total{model="m2",route="lab"} 1.0',
    ]


@pytest_twisted.ensureDeferred
async def test_a_merged_route_lists_the_models_of_all_its_hosts(rig: Rig) -> None:
    """list_models: merged: crossbar answers with every model of the route's healthy hosts,
    where a forwarded listing shows only the chosen host's."""
    response, body = await call(rig, "GET", "/all/v1/models?limit=5")
    assert response.code == 200
    assert header(response, "content-type") == "application/json"
    assert header(response, "x-crossbar-host") is None  # no host answered it
    listing = json.loads(body)
    owners = {m["id"]: (m["owned_by"], m["status"]["value"]) for m in listing["data"]}
    assert owners == {"m1": ("gpu-a", "loaded"), "m2": ("gpu-b", "loaded")}
    assert rig.built.logs.matching("all - GET /v1/models 200")

    _, forwarded = await call(rig, "GET", "/lab/v1/models")
    assert [m["id"] for m in json.loads(forwarded)["data"]] == ["m1"]  # gpu-a's only


@pytest_twisted.ensureDeferred
async def test_a_merged_route_with_no_healthy_host_is_503(rig: Rig) -> None:
    rig.table.mark_down("gpu-a", "test")
    rig.table.mark_down("gpu-b", "test")
    response, body = await call(rig, "GET", "/all/v1/models")
    assert response.code == 503
    words = f"no healthy host for route all: {DOWN}"
    assert json.loads(body) == api_error(503, words)


@pytest_twisted.ensureDeferred
async def test_forwarding_keeps_path_query_body_and_sets_forwarded_headers(rig: Rig) -> None:
    body = b'{"model": "m1", "messages": [{"role": "user", "content": "hi"}]}'
    response, answer = await call(
        rig,
        "POST",
        "/lab/v1/chat/completions?x=1&y=%20",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-Forwarded-For": "10.9.9.9",
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "drop me",
            "Keep-Alive": "timeout=5",
            "Authorization": "Bearer sk-test",
            "Forwarded": "for=192.0.2.60",
            "X-Real-IP": "192.0.2.60",
            "X-Crossbar-Host": "gpu-z",
        },
    )
    assert response.code == 200
    assert header(response, "x-crossbar-host") == "gpu-a"
    assert header(response, "x-upstream") == "yes"  # upstream headers come back
    seen = json.loads(answer)
    assert seen["uri"] == "/v1/chat/completions?x=1&y=%20"
    assert seen["body"].encode() == body  # the exact same bytes
    headers = seen["headers"]
    host = rig.upstreams["gpu-a"].url.removeprefix("http://")
    assert headers["host"] == [host]
    assert headers["x-forwarded-for"] == ["127.0.0.1"]  # 127.0.0.1 is no trusted proxy
    assert headers["x-forwarded-proto"] == ["http"]
    assert headers["x-forwarded-host"] == [rig.base.removeprefix("http://")]
    assert headers["authorization"] == ["Bearer sk-test"]
    assert headers["content-length"] == [str(len(body))]
    for hop in ("x-secret-hop", "keep-alive", "forwarded", "x-real-ip", "x-crossbar-host"):
        assert hop not in headers
    assert headers.get("connection", ["close"]) != ["keep-alive, X-Secret-Hop"]


@pytest_twisted.ensureDeferred
async def test_a_trusted_proxy_s_forwarded_for_is_extended(reactor: Any) -> None:
    upstream = Upstream(("m1",))
    upstream.port = reactor.listenTCP(0, site(upstream), interface="127.0.0.1")
    trusted = (ipaddress.ip_network("127.0.0.0/8"),)
    built = await support.build(
        {"gpu-a": upstream.url},
        routes={"lab": RouteConfig("lab", ("gpu-a",), "m1")},
        up=("gpu-a",),
        adjust=lambda config: attrs.evolve(config, trusted_proxies=trusted),
    )
    try:
        response = await built.client.post(
            built.base + "/lab/v1/chat/completions",
            data=b"{}",
            headers={"X-Forwarded-For": "10.9.9.9", "X-Real-IP": "10.9.9.9"},
        )
        seen = json.loads(await treq.content(response))
    finally:
        await support.teardown(built)
        await upstream.port.stopListening()
    assert seen["headers"]["x-forwarded-for"] == ["10.9.9.9, 127.0.0.1"]
    assert "x-real-ip" not in seen["headers"]


@pytest_twisted.ensureDeferred
async def test_model_loaded_only_on_second_host_goes_there(rig: Rig) -> None:
    response, _answer = await call(rig, "POST", "/lab/v1/chat/completions", json={"model": "m2"})
    assert header(response, "x-crossbar-host") == "gpu-b"
    assert rig.upstreams["gpu-a"].seen == []
    response, _ = await call(rig, "POST", "/lab/v1/chat/completions", json={"model": "m1"})
    assert header(response, "x-crossbar-host") == "gpu-a"


@pytest_twisted.ensureDeferred
async def test_default_model_is_filled_in_and_routes(rig: Rig) -> None:
    body = b'{"messages": [], "stream": false}'
    response, answer = await call(rig, "POST", "/lab/v1/chat/completions", data=body)
    seen = json.loads(answer)
    assert seen["body"] == '{"model":"m1","messages": [], "stream": false}'
    assert seen["headers"]["content-length"] == [str(len(seen["body"]))]
    assert header(response, "x-crossbar-host") == "gpu-a"


@pytest_twisted.ensureDeferred
async def test_body_that_is_not_json_is_forwarded_untouched(rig: Rig) -> None:
    response, answer = await call(rig, "POST", "/nodefault/v1/completions", data=b"[not json")
    assert response.code == 200
    assert json.loads(answer)["body"] == "[not json"


@pytest_twisted.ensureDeferred
async def test_no_healthy_host_is_503_and_marks_nothing(rig: Rig) -> None:
    rig.table.mark_down("gpu-a", "test")
    rig.table.mark_down("gpu-b", "test")
    response, body = await call(rig, "GET", "/lab/v1/models")
    assert response.code == 503
    words = f"no healthy host for route lab: {DOWN}"
    assert json.loads(body) == api_error(503, words)


@pytest_twisted.ensureDeferred
async def test_unreachable_host_is_marked_down_and_answers_502(rig: Rig) -> None:
    for upstream in rig.upstreams.values():
        await upstream.port.stopListening()
    await rig.crossbar.proxy.context.upstreams.drop_idle()
    response, body = await call(rig, "POST", "/lab/v1/chat/completions", json={"model": "m1"})
    assert response.code == 502
    # failover tried gpu-a (has m1), then gpu-b; the answer names the last host tried
    assert json.loads(body) == api_error(502, "upstream failed (host gpu-b)")
    for name in ("gpu-a", "gpu-b"):
        state = rig.table.get(name)
        assert state is not None and not state.healthy
        assert state.last_err == "marked down: connection refused"


@pytest_twisted.ensureDeferred
async def test_exactly_16_mib_passes_and_one_byte_more_is_413(rig: Rig) -> None:
    from twisted.internet.threads import deferToThread

    body = b'{"model":"m1","pad":"' + b"x" * (MAX_BODY - 23) + b'"}'
    assert len(body) == MAX_BODY
    rig.upstreams["gpu-a"].handler = lambda request: b"{}"
    response, _ = await call(rig, "POST", "/lab/v1/chat/completions", data=body)
    assert response.code == 200
    assert len(rig.upstreams["gpu-a"].seen[0]["body"]) == MAX_BODY

    # A client that sends the whole oversized body anyway still reads the 413.
    port = rig.crossbar.listener.port.getHost().port  # type: ignore[union-attr]
    head = b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    answer = await deferToThread(raw_exchange, port, head % (MAX_BODY + 1) + body + b" ")
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.endswith(
        b'{"error":{"message":"body too large","type":"invalid_request_error","code":413}}'
    )
    assert len(rig.upstreams["gpu-a"].seen) == 1


def raw_exchange(port: int, request: bytes, read_until: bytes = b"}") -> bytes:
    """Send raw bytes; read the answer until the marker or the close (blocking, loopback)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while read_until not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


@pytest_twisted.ensureDeferred
async def test_oversized_upload_is_refused_before_it_is_read(rig: Rig, reactor: Any) -> None:
    from twisted.internet.threads import deferToThread

    port = rig.crossbar.listener.port.getHost().port  # type: ignore[union-attr]
    head = (
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (MAX_BODY + 1)
    )
    answer = await deferToThread(raw_exchange, port, head)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in answer
    assert answer.endswith(
        b'{"error":{"message":"body too large","type":"invalid_request_error","code":413}}'
    )

    # a chunked upload is cut off as soon as it passes the limit
    chunk = b"x" * 65536
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY // 65536 + 1))
    head = (
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    answer = await deferToThread(raw_exchange, port, head + chunked)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert rig.upstreams["gpu-a"].seen == []


class Lockstep:
    """An upstream stream that sends one SSE event, then waits until the client read it."""

    def __init__(self, events: int) -> None:
        self.events = events
        self.sent = 0
        self.request: server.Request | None = None
        self.closed: Deferred[None] = Deferred()

    def __call__(self, request: server.Request) -> Any:
        self.request = request
        request.setHeader(b"content-type", b"text/event-stream")
        request.notifyFinish().addBoth(lambda _: self.closed.callback(None))
        self.send_next()
        return server.NOT_DONE_YET

    def send_next(self) -> None:
        assert self.request is not None
        if self.sent == self.events:
            self.request.write(b"data: [DONE]\n\n")
            self.request.finish()
            return
        if self.sent == 0:
            self.request.write(b": keep-alive comment\n\n")
        self.request.write(b'data: {"n": %d}\n\n' % self.sent)
        self.sent += 1


@pytest_twisted.ensureDeferred
async def test_stream_reaches_client_event_by_event(rig: Rig, reactor: Any) -> None:
    """A buffering proxy would hang here: the next event is sent only once the client read one."""
    upstream = Lockstep(events=5)
    rig.upstreams["gpu-a"].handler = upstream
    response = await rig.client.post(
        rig.base + "/lab/v1/chat/completions", json={"model": "m1", "stream": True}
    )
    assert header(response, "content-type") == "text/event-stream"
    received = b""

    def got(data: bytes) -> None:
        nonlocal received
        received += data
        if received.endswith(b"}\n\n") and received.count(b"data: {") == upstream.sent:
            reactor.callLater(0, upstream.send_next)

    done = treq.collect(response, got)
    done.addTimeout(10, reactor)
    await done
    assert received.startswith(b": keep-alive comment\n\n")
    assert received.count(b"data: {") == 5
    assert received.endswith(b"data: [DONE]\n\n")


class _HoldOpen(Protocol):
    def __init__(self) -> None:
        self.first: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        if not self.first.called:
            self.first.callback(data)

    def connectionLost(self, reason: Any = None) -> None:
        pass


@pytest_twisted.ensureDeferred
async def test_client_leaving_stops_upstream_and_marks_nothing(rig: Rig, reactor: Any) -> None:
    upstream = Lockstep(events=1000)
    rig.upstreams["gpu-a"].handler = upstream
    response = await rig.client.post(
        rig.base + "/lab/v1/chat/completions", json={"model": "m1", "stream": True}
    )
    reader = _HoldOpen()
    response.deliverBody(reader)
    await reader.first
    assert reader.transport is not None
    reader.transport.stopProducing()  # the client hangs up mid-stream
    upstream.closed.addTimeout(1.0, reactor)
    await upstream.closed  # crossbar closed the upstream connection within 1 s
    assert upstream.request is not None and upstream.request.channel is None  # client gone
    state = rig.table.get("gpu-a")
    assert state is not None and state.healthy and state.last_err == ""


@pytest_twisted.ensureDeferred
async def test_upstream_dying_mid_stream_breaks_client_stream(rig: Rig) -> None:
    upstream = Lockstep(events=1000)
    rig.upstreams["gpu-a"].handler = upstream
    response = await rig.client.post(
        rig.base + "/lab/v1/chat/completions", json={"model": "m1", "stream": True}
    )
    finished: Deferred[None] = treq.collect(response, lambda data: None)
    assert upstream.request is not None
    upstream.request.transport.abortConnection()  # type: ignore[union-attr]
    with pytest.raises(Exception) as info:
        await finished
    assert "ResponseFailed" in repr(info.value) or "DataLoss" in repr(info.value)
    state = rig.table.get("gpu-a")
    assert state is not None and not state.healthy
    assert state.last_err.startswith("marked down: answer broken")


def trickle(port: int) -> bytes:
    """A client that sends half its headers, then nothing (blocking, on loopback)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /lab/v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


@pytest_twisted.ensureDeferred
async def test_client_that_trickles_headers_is_cut_off(rig: Rig) -> None:
    from twisted.internet.threads import deferToThread

    site = rig.crossbar.site
    site.limits = attrs.evolve(site.limits, head_timeout=0.2)
    port = rig.crossbar.listener.port.getHost().port  # type: ignore[union-attr]
    answer = await deferToThread(trickle, port)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(
        b'"message":"request head too slow","type":"invalid_request_error","code":408}}'
    )
    # a client that sends its headers in time is not affected
    response, _ = await call(rig, "GET", "/lab/v1/models")
    assert response.code == 200


@pytest_twisted.ensureDeferred
async def test_a_body_stops_counting_once_its_answer_streams(rig: Rig, reactor: Any) -> None:
    """``max_body_memory`` counts bodies crossbar holds: once a host answers, the body is
    given back, so a long stream does not keep a later request out for its whole length."""
    site = rig.crossbar.site
    site.limits = attrs.evolve(site.limits, max_body=1024**2, max_body_memory=1024**2)
    body = {"model": "m1", "stream": True, "pad": "x" * 700_000}
    readers = []
    for _ in range(2):  # two 700 kB bodies would not fit in 1 MiB at once
        rig.upstreams["gpu-a"].handler = Lockstep(events=1000)
        response = await rig.client.post(rig.base + "/lab/v1/chat/completions", json=body)
        assert response.code == 200, await response.text()
        reader = _HoldOpen()
        response.deliverBody(reader)
        await reader.first
        readers.append(reader)
    assert site.body_memory == 0
    for reader in readers:
        assert reader.transport is not None
        reader.transport.stopProducing()

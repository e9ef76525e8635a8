"""How crossbar behaves when hosts fail: failover, disconnects, timeouts, backpressure,
passive and active health, selection policies and isolation between hosts.

Everything runs over real loopback sockets, against simulated llama-server hosts put
into their fault modes.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.web import server
from twisted.web.resource import Resource

from crossbar.config import HostSettings, RouteConfig
from crossbar.sites import CLIENT_IDLE_TIMEOUT
from crossbar.testing import RigMaker, SimulatedHost, broken, eventually, fast, guard, rigs
from tests.support import Blackhole, header, memory, raw_request, start_daemon
from tests.support.errors import api_error

DOWN = "gpu-a down (marked down: test), gpu-b down (marked down: test)"
"""How a 503 names the two hosts a test marked down."""

CHAT = "/lab/v1/chat/completions"
BODY = (
    b'{"model": "tiny-a", "messages": [{"role": "user", "content": "h\\u00e9"}], "max_tokens": 3}'
)
STREAM = {"model": "tiny-a", "messages": [], "stream": True}


def reactor_() -> Any:
    """The running reactor (pytest-twisted's global one)."""
    from twisted.internet import reactor

    return reactor


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


def sims(*names: str, **kwargs: Any) -> dict[str, SimulatedHost]:
    return {name: SimulatedHost(**kwargs) for name in names}


async def upstream_closed(sim: SimulatedHost, seconds: float = 1.0) -> None:
    """Wait until the simulator has no stream left open (its connection closed)."""
    deadline = reactor_().seconds() + seconds
    while sim.active_streams:
        left = deadline - reactor_().seconds()
        assert left > 0, "the upstream stream is still open"
        await guard(sim.wait_connection_closed(), left, "upstream connection closed")


# -- 1. failover before the first byte --------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_refused_host_fails_over_with_the_same_bytes(make: RigMaker) -> None:
    """A host that refuses the connection is marked down (max_fails defaults to 1) and the
    very same request bytes are sent to the next host, whose answer the client gets."""
    assert HostSettings().max_fails == 1
    rig = await make(sims("gpu-a", "gpu-b"))
    await rig.sims["gpu-a"].refuse()
    response, answer = await rig.post(CHAT, BODY)
    assert response.code == 200
    assert header(response, "x-crossbar-host") == "gpu-b"
    assert json.loads(answer)["choices"][0]["message"]["content"] == "abc"
    assert rig.completions("gpu-b") == [BODY]
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err == "marked down: connection refused"
    assert rig.logs.matching("route lab: gpu-a failed before answering", "trying gpu-b")
    assert rig.logs.matching(
        "lab gpu-b POST /v1/chat/completions 200", "(tried gpu-a: connection refused, gpu-b)"
    )


@pytest.mark.parametrize("fault", ["close", "reset"])
@pytest_twisted.ensureDeferred
async def test_host_closing_before_status_line_fails_over(make: RigMaker, fault: str) -> None:
    """A host that takes the request and then closes or resets the connection without a
    status line is marked down, and the request is retried, same bytes, on the next host."""
    rig = await make(sims("gpu-a", "gpu-b"))
    rig.sims["gpu-a"].fault = fault  # type: ignore[assignment]
    body = b'{"model": "tiny-a", "max_tokens": 2, "pad": "%s"}' % (b"\xc3\xa9" * 200_000)
    response, _ = await rig.post(CHAT, body)
    assert response.code == 200
    assert header(response, "x-crossbar-host") == "gpu-b"
    assert rig.completions("gpu-a") == [body]
    assert rig.completions("gpu-b") == [body]
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err.startswith("marked down: closed before answering")
    assert rig.logs.matching("(tried gpu-a: closed before answering", ", gpu-b)")


@pytest_twisted.ensureDeferred
async def test_failover_follows_the_choice_rule_then_502_names_last_host(make: RigMaker) -> None:
    """Hosts are tried in the order the choice rule gives (model loaded, then known, then
    any healthy host), each once; when all failed the answer is 502 naming the last one."""
    hosts = {
        "gpu-a": SimulatedHost({"tiny-z": "loaded"}),
        "gpu-b": SimulatedHost({"tiny-z": "loaded", "tiny-b": "unloaded"}),
        "gpu-c": SimulatedHost({"tiny-b": "loaded"}),
    }
    rig = await make(hosts)
    order: list[str] = []

    def note(_: object, name: str) -> None:
        order.append(name)

    for name, sim in hosts.items():
        sim.fault = "close"
        sim.wait_request().addCallback(note, name)
    response, answer = await rig.post(CHAT, b'{"model": "tiny-b", "messages": []}')
    assert response.code == 502
    assert json.loads(answer) == api_error(502, "upstream failed (host gpu-a)")
    assert order == ["gpu-c", "gpu-b", "gpu-a"]
    assert all(len(rig.completions(name)) == 1 for name in hosts)
    assert not any(rig.state(name).healthy for name in hosts)
    assert rig.logs.matching(
        "lab gpu-a POST /v1/chat/completions 502",
        "(tried gpu-c: closed",
        ", gpu-b: closed",
        ", gpu-a)",
    )


@pytest_twisted.ensureDeferred
async def test_failover_stops_when_the_healthy_hosts_are_exhausted(make: RigMaker) -> None:
    """A host already down is not tried: after the healthy ones failed the answer is 502."""
    rig = await make(sims("gpu-a", "gpu-b", "gpu-c"))
    rig.crossbar.table.mark_down("gpu-b", "test")
    rig.sims["gpu-a"].fault = "close"
    rig.sims["gpu-c"].fault = "close"
    response, answer = await rig.post(CHAT, BODY)
    assert response.code == 502
    assert json.loads(answer) == api_error(502, "upstream failed (host gpu-c)")
    assert rig.completions("gpu-b") == []
    assert len(rig.completions("gpu-a")) == len(rig.completions("gpu-c")) == 1


@pytest_twisted.ensureDeferred
async def test_each_failed_try_counts_toward_max_fails(make: RigMaker) -> None:
    """With max_fails 2, the first failed try leaves the host in service (the request still
    fails over); the second marks it down; then it is no longer tried at all."""
    rig = await make(sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(max_fails=2)})
    rig.sims["gpu-a"].fault = "close"
    response, _ = await rig.post(CHAT, BODY)
    assert header(response, "x-crossbar-host") == "gpu-b"
    state = rig.state("gpu-a")
    assert (state.healthy, state.fails) == (True, 1)
    response, _ = await rig.post(CHAT, BODY)
    assert header(response, "x-crossbar-host") == "gpu-b"
    state = rig.state("gpu-a")
    assert (state.healthy, state.fails) == (False, 2)
    await rig.post(CHAT, BODY)
    assert len(rig.completions("gpu-a")) == 2
    assert len(rig.completions("gpu-b")) == 3


@pytest_twisted.ensureDeferred
async def test_no_retry_after_header_timeout(make: RigMaker) -> None:
    """A host that takes the request and sends no status line within header_timeout may still
    be working on it: crossbar answers 504, marks the host down, closes that connection, and
    does not send the request anywhere else."""
    rig = await make(sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(header_timeout=0.3)})
    sim = rig.sims["gpu-a"]
    sim.fault = "hang"
    closed = sim.wait_connection_closed()
    started = reactor_().seconds()
    response, answer = await rig.post(CHAT, BODY, timeout=1.5)
    elapsed = reactor_().seconds() - started
    assert response.code == 504
    assert json.loads(answer) == api_error(504, "upstream timeout (host gpu-a)")
    assert 0.25 <= elapsed < 1.5
    assert rig.completions("gpu-b") == []
    assert rig.state("gpu-a").last_err == "marked down: no answer within 0.3s"
    assert rig.logs.matching("host gpu-a sent no answer within 0.3s")
    await guard(closed, 1.0, "upstream connection closed")


# -- 2. client disconnect stops the GPU -------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_client_leaving_mid_stream_closes_upstream_and_marks_nothing(
    make: RigMaker,
) -> None:
    """The client hangs up mid-stream: the simulator sees its connection closed within 1 s
    (generation stops), the host stays healthy, and nothing is left counted in flight."""
    rig = await make(sims("gpu-a", chunks=100_000, chunk_interval=0.005))
    sim = rig.sims["gpu-a"]
    response, reader = await rig.stream(CHAT, STREAM)
    assert response.code == 200
    await guard(reader.bytes(2000), 5, "first chunks")
    assert sim.active_streams == 1
    reader.hang_up()
    await upstream_closed(sim, 1.0)
    sent = sim.chunks_sent
    assert sent < 100_000
    state = rig.state("gpu-a")
    assert (state.healthy, state.fails, state.last_err) == (True, 0, "")
    assert rig.crossbar.traffic.in_flight == {"gpu-a": 0}
    assert rig.logs.matching("lab gpu-a POST /v1/chat/completions 499", "(client left)")
    assert not rig.logs.matching("gpu-a", "broke")
    # Counted as the client not getting its answer, though the answer had begun.
    metrics = rig.crossbar.metrics.render().decode()
    assert 'crossbar_requests_total{code="499",host="gpu-a",route="lab"} 1.0' in metrics
    assert 'code="200"' not in metrics


@pytest_twisted.ensureDeferred
async def test_client_leaving_before_the_answer_closes_upstream(make: RigMaker) -> None:
    """The client gives up while the host is still silent (before any status line): the
    upstream connection is closed at once and the host is not marked down."""
    rig = await make(sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(header_timeout=30)})
    sim = rig.sims["gpu-a"]
    sim.fault = "hang"
    arrived = sim.wait_request()
    request = rig.client.post(rig.base + CHAT, data=BODY)
    request.addErrback(lambda _: None)
    await guard(arrived, 2, "request upstream")
    closed = sim.wait_connection_closed()
    request.cancel()
    await guard(closed, 1.0, "upstream connection closed")
    await eventually(lambda: rig.crossbar.traffic.in_flight["gpu-a"] == 0, 1.0, "in_flight 0")
    state = rig.state("gpu-a")
    assert (state.healthy, state.fails, state.last_err) == (True, 0, "")
    assert rig.completions("gpu-b") == []


# -- 3. upstream dies mid-stream --------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_upstream_reset_mid_stream_breaks_the_client_stream(make: RigMaker) -> None:
    """The host resets the connection after some chunks: the client's stream is cut without
    a clean end (no [DONE], no final chunk), the host is marked down, a log line says so,
    and the request is not retried elsewhere (bytes already reached the client)."""
    rig = await make(sims("gpu-a", "gpu-b", chunks=1000, chunk_interval=0.01))
    sim = rig.sims["gpu-a"]
    sim.fault = "reset"
    sim.reset_after = 3
    response, reader = await rig.stream(CHAT, STREAM)
    assert response.code == 200
    reason = await reader.end(5)
    assert broken(reason), reason
    assert reader.data.count(b"data: {") >= 1
    assert b"[DONE]" not in reader.data
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err.startswith("marked down: answer broken")
    assert rig.logs.matching("host gpu-a broke an answer off")
    assert rig.logs.matching("lab gpu-a POST /v1/chat/completions 200", "(answer cut off)")
    assert rig.completions("gpu-b") == []


# -- 4. timeouts -----------------------------------------------------------------------------


@pytest.fixture
def hole() -> Iterator[Callable[[int], Blackhole]]:
    """Makes black-hole ports (checking that a connect to them really hangs here)."""
    holes: list[Blackhole] = []

    def make_hole(port: int = 0) -> Blackhole:
        hole = Blackhole(port)
        holes.append(hole)
        assert hole.hangs(), "a connect to a full accept queue did not hang on this system"
        return hole

    yield make_hole
    for h in holes:
        h.close()


async def go_dark(sim: SimulatedHost, hole: Any) -> None:
    """The host stops answering connects at all (its port turns into a black hole)."""
    port = urlsplit(sim.url).port
    await sim.refuse()
    hole(port)


@pytest_twisted.ensureDeferred
async def test_connect_timeout_fails_over(make: RigMaker, hole: Any) -> None:
    """A host whose connect hangs is given up after its connect_timeout (not a fixed
    default), marked down, and the request is answered by the next host."""
    rig = await make(
        sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(connect_timeout=0.3, header_timeout=5)}
    )
    await go_dark(rig.sims["gpu-a"], hole)
    started = reactor_().seconds()
    response, _ = await rig.post(CHAT, BODY)
    elapsed = reactor_().seconds() - started
    assert response.code == 200
    assert header(response, "x-crossbar-host") == "gpu-b"
    assert 0.25 <= elapsed < 1.0, elapsed
    assert rig.state("gpu-a").last_err == "marked down: cannot connect: timed out after 0.3s"
    assert rig.logs.matching(
        "gpu-a failed before answering (cannot connect: timed out after 0.3s); trying gpu-b"
    )


@pytest_twisted.ensureDeferred
async def test_connect_timeout_on_the_last_host_is_504(make: RigMaker, hole: Any) -> None:
    """When the last host to try timed out connecting, the answer is 504 upstream timeout."""
    rig = await make(sims("gpu-a"), settings={"gpu-a": fast(connect_timeout=0.3)})
    await go_dark(rig.sims["gpu-a"], hole)
    response, answer = await rig.post(CHAT, BODY)
    assert response.code == 504
    assert json.loads(answer) == api_error(504, "upstream timeout (host gpu-a)")
    assert not rig.state("gpu-a").healthy


@pytest_twisted.ensureDeferred
async def test_client_leaving_while_connecting_cancels_the_connect(
    make: RigMaker, hole: Any
) -> None:
    """The client gives up while crossbar is still connecting: the attempt is dropped (no
    timer is left behind) and the host is not marked down."""
    rig = await make(sims("gpu-a"), settings={"gpu-a": fast(connect_timeout=20, header_timeout=30)})
    await go_dark(rig.sims["gpu-a"], hole)
    request = rig.client.post(rig.base + CHAT, data=BODY)
    request.addErrback(lambda _: None)
    in_flight = rig.crossbar.traffic.in_flight
    await eventually(lambda: in_flight["gpu-a"] == 1, 2.0, "request in flight")
    request.cancel()
    await eventually(lambda: in_flight["gpu-a"] == 0, 1.0, "request over")
    state = rig.state("gpu-a")
    assert (state.healthy, state.last_err) == (True, "")
    # the autouse reactor check fails this test if a connect timer is still pending


@pytest_twisted.ensureDeferred
async def test_idle_timeout_mid_stream_closes_the_client_stream(make: RigMaker) -> None:
    """A host that goes quiet for longer than idle_timeout after sending part of a stream:
    the client's stream is closed without a clean end, the host is marked down, the upstream
    connection is closed, and a log line says so."""
    rig = await make(
        sims("gpu-a", chunks=5, chunk_interval=3.0), settings={"gpu-a": fast(idle_timeout=0.3)}
    )
    sim = rig.sims["gpu-a"]
    response, reader = await rig.stream(CHAT, STREAM)
    assert response.code == 200
    reason = await reader.end(2)
    assert broken(reason), reason
    assert reader.data.startswith(b"data: {")  # the first event did reach the client
    assert b"[DONE]" not in reader.data
    assert rig.state("gpu-a").last_err == "marked down: answer idle for 0.3s"
    assert rig.logs.matching("host gpu-a went quiet for 0.3s mid-answer")
    await upstream_closed(sim, 1.0)


class StallingHost(Resource):
    """A host that is healthy, then answers a completion with a status line and headers
    (Content-Length 100) and never sends the body."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.stalled: list[server.Request] = []
        self.closed: Deferred[None] = Deferred()

    def render(self, request: server.Request) -> Any:
        if request.uri == b"/health":
            return b'{"status":"ok"}'
        if request.uri == b"/v1/models":
            return b'{"data":[{"id":"tiny-a"}],"object":"list"}'
        request.setHeader(b"content-length", b"100")
        request.write(b"")  # the status line and headers go out, no body byte
        self.stalled.append(request)
        request.notifyFinish().addBoth(lambda _: self.closed.callback(None))
        return server.NOT_DONE_YET


@pytest_twisted.ensureDeferred
async def test_idle_timeout_before_any_body_byte_is_504(make: RigMaker) -> None:
    """A host that sends its headers but no body byte within idle_timeout: nothing reached the
    client yet, so it gets 504 upstream timeout; the host is marked down and its connection
    closed."""
    stalling = StallingHost()
    port = reactor_().listenTCP(0, server.Site(stalling, timeout=None), interface="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{port.getHost().port}"
        rig = await make({"gpu-a": url}, settings={"gpu-a": fast(idle_timeout=0.3)}, up=[])
        await rig.crossbar.poller.poll_now("gpu-a")
        assert rig.state("gpu-a").healthy
        response, answer = await rig.post(CHAT, BODY)
        assert response.code == 504
        assert json.loads(answer) == api_error(504, "upstream timeout (host gpu-a)")
        assert rig.state("gpu-a").last_err == "marked down: answer idle for 0.3s"
        await guard(stalling.closed, 1.0, "upstream connection closed")
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_poll_timeout_marks_a_silent_host_down_without_delaying_others(
    make: RigMaker,
) -> None:
    """A host that does not answer its health poll within poll_timeout is marked down; the
    hanging poll's connection is closed; meanwhile another host's poll is not delayed."""
    rig = await make(sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(poll_timeout=0.5)})
    sim = rig.sims["gpu-a"]
    sim.fault = "hang"
    poller = rig.crossbar.poller
    started = reactor_().seconds()
    slow = poller.poll_now("gpu-a")
    await guard(poller.poll_now("gpu-b"), 0.4, "poll of the other host")
    assert not slow.called  # gpu-b's poll ended while gpu-a's still hung
    assert rig.state("gpu-b").healthy
    await guard(slow, 2, "poll end")
    assert 0.45 <= reactor_().seconds() - started < 2
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err == "health: timed out after 0.5s"
    await eventually(lambda: sim.open_connections == 0, 1.0, "poll connection closed")


# -- 5. backpressure and limits ---------------------------------------------------------------


def connect_quietly(port: int, request: bytes) -> socket.socket:
    """A client that sends its request and then reads nothing (a small receive buffer)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(request)
    return s


def read_until_done(s: socket.socket, limit: float = 30.0) -> int:
    """Read an answer to its end (``[DONE]`` or close); the byte count."""
    s.settimeout(limit)
    total = 0
    tail = b""
    while True:
        data = s.recv(1 << 20)
        if not data:
            break
        total += len(data)
        tail = (tail + data)[-64:]
        if b"data: [DONE]\n\n" in tail:
            break
    return total


@pytest_twisted.ensureDeferred
async def test_slow_client_pauses_the_upstream(make: RigMaker) -> None:
    """A client that stops reading makes crossbar stop reading from the host: the simulator
    is paused after a few MiB of a 64 MiB answer. The pause is not taken for a silent host,
    and the whole answer arrives once the client reads again. (A pause as long as
    idle_timeout ends both sides: tests/unit/proxy/test_exchange.py.)"""
    rig = await make(
        sims("gpu-a", chunks=1024, chunk_size=64 * 1024),
        settings={"gpu-a": fast(idle_timeout=3.0)},
    )
    sim = rig.sims["gpu-a"]
    body = json.dumps(STREAM).encode()
    s = connect_quietly(rig.port, raw_request(rig.port, CHAT, body))
    try:
        await eventually(lambda: sim.chunks_sent > 0, 3.0, "stream started")
        last, still = -1, 0
        while still < 20:  # wait for 20 looks in a row (0.2 s) without progress
            await _tick()
            still = still + 1 if sim.chunks_sent == last else 0
            last = sim.chunks_sent
            assert sim.chunks_sent < 1024, "the whole answer went through a client not reading"
        await deferLater(reactor_(), 0.3, lambda: None)  # paused for 0.5 s in all
        paused_at = sim.chunks_sent * 64 * 1024
        print(f"upstream paused after {paused_at / 2**20:.1f} MiB")
        assert paused_at < 16 * 2**20
        assert sim.active_streams == 1
        assert rig.state("gpu-a").healthy
        total = await deferToThread(read_until_done, s)
    finally:
        s.close()
    assert total > 1024 * 64 * 1024
    assert sim.chunks_sent == 1024
    assert rig.state("gpu-a").healthy


def _tick() -> Deferred[None]:
    return deferLater(reactor_(), 0.01, lambda: None)


def send_and_read(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes and read until crossbar closes (a reset counts as a close)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(request)
            while data := s.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
    return answer


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(b"X-Big: " + b"x" * 20_000 + b"\r\n", id="one-long-header"),
        pytest.param(b"".join(b"X-H%d: %s\r\n" % (i, b"y" * 40) for i in range(400)), id="size"),
        pytest.param(b"".join(b"X-H%d: 1\r\n" % i for i in range(600)), id="count"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_oversized_request_headers_are_refused(make: RigMaker, extra: bytes) -> None:
    """Headers beyond the Site's limits (a 16 KiB line, 16 KiB in all, 500 of them) are
    answered and end the connection: 431 for the one line, 400 for the others; nothing
    reaches a host."""
    rig = await make(sims("gpu-a"))
    request = raw_request(rig.port, CHAT, BODY, extra)
    answer = await deferToThread(send_and_read, rig.port, request)
    status = b"431 " if extra.count(b"\r\n") == 1 else b"400 "
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:100]
    assert rig.completions("gpu-a") == []


@pytest_twisted.ensureDeferred
async def test_idle_client_connection_is_closed(make: RigMaker) -> None:
    """The listening Site has an idle timeout: a client connection that sends nothing is
    closed by crossbar (the timeout is shortened here from its default)."""
    rig = await make(sims("gpu-a"))
    site = rig.crossbar.site
    assert site.timeOut == CLIENT_IDLE_TIMEOUT
    assert CLIENT_IDLE_TIMEOUT is not None and CLIENT_IDLE_TIMEOUT <= 300
    site.timeOut = 0.3

    def idle() -> tuple[bytes, float]:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", rig.port), timeout=5) as s:
            data = s.recv(1024)  # b"" once crossbar closes the connection
        return data, time.monotonic() - started

    data, elapsed = await deferToThread(idle)
    assert data == b""
    assert 0.2 <= elapsed < 2.0


def slow_reader(port: int, request: bytes, pause: float) -> tuple[int, float]:
    """Send a request, then read 64 KiB at a time with a pause after each read."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
        s.sendall(request)
        total = 0
        tail = b""
        while True:
            data = s.recv(64 * 1024)
            if not data:
                break
            total += len(data)
            tail = (tail + data)[-64:]
            if b"data: [DONE]\n\n" in tail:
                break
            time.sleep(pause)
    return total, time.monotonic() - started


@pytest_twisted.ensureDeferred
async def test_256_mib_to_a_slow_client_keeps_crossbar_memory_flat(tmp_path: Path) -> None:
    """256 MiB streamed from a host to a client that reads slowly: crossbar (a real twistd
    process) pauses the host instead of buffering, so its memory grows by less than 32 MiB."""
    chunk = 64 * 1024
    count = 256 * 1024 * 1024 // chunk
    sim = SimulatedHost(chunks=count, chunk_size=chunk)
    await sim.listen(0, "127.0.0.1")
    daemon = None
    try:
        daemon = await deferToThread(
            start_daemon,
            tmp_path,
            f"poll_interval: 1h\nidle_timeout: 30s\nhosts:\n  gpu-a: {sim.url}\n"
            "routes:\n  lab:\n    hosts: [gpu-a]\n    default_model: tiny-a\n",
        )
        port = daemon.port
        await eventually(lambda: any(r.path == "/v1/models" for r in sim.requests), 10, "poll")
        warm = json.dumps({**STREAM, "max_tokens": 64}).encode()
        await deferToThread(slow_reader, port, raw_request(port, CHAT, warm), 0)
        before = memory(daemon.proc.pid)
        body = json.dumps(STREAM).encode()
        total, seconds = await deferToThread(
            slow_reader, port, raw_request(port, CHAT, body), 0.001
        )
        after = memory(daemon.proc.pid)
        growth = (after["VmHWM"] - before["VmRSS"]) / 1024
        print(
            f"\nstreamed {total / 2**20:.0f} MiB in {seconds:.1f}s; crossbar VmRSS before "
            f"{before['VmRSS'] / 1024:.1f} MiB, VmHWM before {before['VmHWM'] / 1024:.1f} MiB, "
            f"VmRSS after {after['VmRSS'] / 1024:.1f} MiB, VmHWM after "
            f"{after['VmHWM'] / 1024:.1f} MiB; growth {growth:.1f} MiB"
        )
        assert total > count * chunk
        assert sim.chunks_sent == count + 64  # and the 64 of the first, small stream
        assert growth < 32
    finally:
        if daemon is not None:
            await deferToThread(daemon.stop)
        await sim.stop()


# -- 6. passive and active health ------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_unhealthy_status_marks_the_host_down(make: RigMaker) -> None:
    """An answer whose status is listed in unhealthy_status marks the host down; a 5xx is
    tried on the next host (nothing of it reached the client), and the next request goes on."""
    rig = await make(sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(unhealthy_status={500})})
    rig.sims["gpu-a"].fault = "error"
    response, answer = await rig.post(CHAT, BODY)
    assert response.code == 200
    assert header(response, "x-crossbar-host") == "gpu-b"
    assert b"simulated server error" not in answer
    assert rig.logs.matching("(tried gpu-a: answered 500, gpu-b)")
    assert rig.state("gpu-a").last_err == "marked down: HTTP 500"
    response, _ = await rig.post(CHAT, BODY)
    assert header(response, "x-crossbar-host") == "gpu-b"


@pytest_twisted.ensureDeferred
async def test_status_not_listed_is_not_a_failure(make: RigMaker) -> None:
    """A 503 (a model loading) from a host whose unhealthy_status lists only 500 is tried on
    the next host, but counts as a good answer (the host is not marked down)."""
    rig = await make(sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(unhealthy_status={500})})
    rig.sims["gpu-a"].fault = "loading"
    response, _ = await rig.post(CHAT, BODY)
    assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-b")
    state = rig.state("gpu-a")
    assert (state.healthy, state.fails) == (True, 0)


@pytest_twisted.ensureDeferred
async def test_unhealthy_latency_marks_a_slow_host_down(make: RigMaker) -> None:
    """A host whose status line takes longer than unhealthy_latency: the answer is passed on,
    but the host is marked down. A quicker answer does not count."""
    rig = await make(
        sims("gpu-a", "gpu-b", chunk_interval=0.05),
        settings={"gpu-a": fast(unhealthy_latency=0.15)},
    )
    quick = b'{"model": "tiny-a", "messages": [], "max_tokens": 0}'  # at once
    response, _ = await rig.post(CHAT, quick)
    assert response.code == 200
    assert rig.state("gpu-a").healthy
    slow = b'{"model": "tiny-a", "messages": [], "max_tokens": 8}'  # about 0.4 s
    response, answer = await rig.post(CHAT, slow)
    assert response.code == 200
    assert header(response, "x-crossbar-host") == "gpu-a"
    assert json.loads(answer)["choices"][0]["message"]["content"] == "abcdefgh"
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err.startswith("marked down: answered after ")


@pytest_twisted.ensureDeferred
async def test_max_fails_counts_failures_in_a_row(make: RigMaker) -> None:
    """With max_fails 3, two failed answers keep the host in service, a good one ends the
    run, and only three failures in a row mark it down."""
    rig = await make(
        sims("gpu-a", "gpu-b"), settings={"gpu-a": fast(unhealthy_status={500}, max_fails=3)}
    )
    sim = rig.sims["gpu-a"]
    sim.fault = "error"
    for fails in (1, 2):
        response, _ = await rig.post(CHAT, BODY)
        assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-b")
        assert (rig.state("gpu-a").healthy, rig.state("gpu-a").fails) == (True, fails)
    sim.fault = None
    response, _ = await rig.post(CHAT, BODY)
    assert response.code == 200
    assert rig.state("gpu-a").fails == 0
    sim.fault = "error"
    for _ in range(2):
        await rig.post(CHAT, BODY)
    assert rig.state("gpu-a").healthy
    await rig.post(CHAT, BODY)
    assert not rig.state("gpu-a").healthy
    response, _ = await rig.post(CHAT, BODY)
    assert header(response, "x-crossbar-host") == "gpu-b"


@pytest.mark.parametrize("polls", [1, 2, 3])
@pytest_twisted.ensureDeferred
async def test_recovery_polls_good_polls_before_trusted_again(make: RigMaker, polls: int) -> None:
    """A host marked down by a failed request is trusted again only after recovery_polls good
    polls in a row (2 unless set); until then requests go elsewhere."""
    assert HostSettings().recovery_polls == 2
    own = {} if polls == 2 else {"gpu-a": fast(recovery_polls=polls)}
    rig = await make(sims("gpu-a", "gpu-b"), settings=own)
    sim = rig.sims["gpu-a"]
    await sim.refuse()
    await rig.post(CHAT, BODY)
    assert not rig.state("gpu-a").healthy
    await sim.listen()
    for _ in range(polls - 1):
        await rig.crossbar.poller.poll_now("gpu-a")
        assert not rig.state("gpu-a").healthy
        response, _ = await rig.post(CHAT, BODY)
        assert header(response, "x-crossbar-host") == "gpu-b"
    await rig.crossbar.poller.poll_now("gpu-a")
    assert rig.state("gpu-a").healthy
    response, _ = await rig.post(CHAT, BODY)
    assert header(response, "x-crossbar-host") == "gpu-a"


@pytest_twisted.ensureDeferred
async def test_health_path_is_the_one_polled(make: RigMaker) -> None:
    """Each host is polled at its own health_path; one that answers 404 there is down."""
    hosts = sims("gpu-a", "gpu-b")
    rig = await make(
        hosts,
        settings={"gpu-a": fast(health_path="/v1/health"), "gpu-b": fast(health_path="/healthz")},
        up=["gpu-a"],
    )
    await rig.crossbar.poller.poll_now("gpu-b")
    assert "/v1/health" in hosts["gpu-a"].paths()
    assert "/health" not in hosts["gpu-a"].paths()
    assert "/healthz" in hosts["gpu-b"].paths()
    state = rig.state("gpu-b")
    assert not state.healthy
    assert state.last_err == "health: HTTP 404"


@pytest_twisted.ensureDeferred
async def test_poll_interval_is_per_host(make: RigMaker) -> None:
    """A host with a short poll_interval is polled again and again; one with a long one is
    polled once, at start."""
    hosts = sims("gpu-a", "gpu-b")
    await make(hosts, settings={"gpu-a": fast(poll_interval=0.1)})
    for _ in range(3):
        while (await guard(hosts["gpu-a"].wait_request(), 1.0, "poll")).path != "/health":
            pass
    assert hosts["gpu-a"].paths().count("/health") >= 4
    assert hosts["gpu-b"].paths().count("/health") == 1


# -- 7. selection policy ----------------------------------------------------------------------


def route(policy: str = "priority", when_all_down: str = "fail", *hosts: str) -> dict[str, Any]:
    names = hosts or ("gpu-a", "gpu-b", "gpu-c")
    return {"lab": RouteConfig("lab", names, "tiny-a", policy, when_all_down)}


async def hosts_answering(rig: Any, n: int, body: bytes = BODY) -> list[str | None]:
    answers = []
    for _ in range(n):
        response, _ = await rig.post(CHAT, body)
        assert response.code == 200
        answers.append(header(response, "x-crossbar-host"))
    return answers


@pytest_twisted.ensureDeferred
async def test_priority_sends_everything_to_the_first_host(make: RigMaker) -> None:
    """The default policy is priority: the first eligible host in the route's order."""
    rig = await make(sims("gpu-a", "gpu-b", "gpu-c"))
    assert rig.crossbar.config.routes["lab"].policy == "priority"
    assert await hosts_answering(rig, 4) == ["gpu-a"] * 4


@pytest_twisted.ensureDeferred
async def test_round_robin_starts_with_the_first_host(make: RigMaker) -> None:
    """round_robin takes the hosts in turn, starting with the first."""
    rig = await make(sims("gpu-a", "gpu-b", "gpu-c"), routes=route("round_robin"))
    assert await hosts_answering(rig, 6) == ["gpu-a", "gpu-b", "gpu-c"] * 2


@pytest_twisted.ensureDeferred
async def test_round_robin_stays_within_the_best_group(make: RigMaker) -> None:
    """round_robin turns only among the hosts with the model loaded, not those that merely
    know it."""
    hosts = {
        "gpu-a": SimulatedHost({"tiny-a": "unloaded"}),
        "gpu-b": SimulatedHost({"tiny-a": "loaded"}),
        "gpu-c": SimulatedHost({"tiny-a": "loaded"}),
    }
    rig = await make(hosts, routes=route("round_robin"))
    assert await hosts_answering(rig, 4) == ["gpu-b", "gpu-c"] * 2


@pytest_twisted.ensureDeferred
async def test_least_busy_takes_the_host_with_fewest_in_flight(make: RigMaker) -> None:
    """least_busy picks the loaded host with the fewest requests in flight, ties to the
    earlier host, and never leaves the loaded group for an idle host that only knows the
    model."""
    hosts = {
        "gpu-a": SimulatedHost(chunks=100_000, chunk_interval=0.01),
        "gpu-b": SimulatedHost(chunks=100_000, chunk_interval=0.01),
        "gpu-c": SimulatedHost({"tiny-a": "unloaded"}),
    }
    rig = await make(hosts, routes=route("least_busy"))
    first, one = await rig.stream(CHAT, STREAM)
    second, two = await rig.stream(CHAT, STREAM)
    assert header(first, "x-crossbar-host") == "gpu-a"
    assert header(second, "x-crossbar-host") == "gpu-b"
    assert rig.crossbar.traffic.in_flight == {"gpu-a": 1, "gpu-b": 1, "gpu-c": 0}
    assert await hosts_answering(rig, 1) == ["gpu-a"]  # a tie: the earlier host
    one.hang_up()
    await upstream_closed(hosts["gpu-a"])
    third, three = await rig.stream(CHAT, STREAM)
    assert header(third, "x-crossbar-host") == "gpu-a"
    assert await hosts_answering(rig, 1) == ["gpu-a"]  # a has 1, b has 1: earlier host
    two.hang_up()
    assert await hosts_answering(rig, 1) == ["gpu-b"]  # b is idle now
    three.hang_up()
    await upstream_closed(hosts["gpu-a"])
    await upstream_closed(hosts["gpu-b"])
    assert rig.completions("gpu-c") == []


@pytest_twisted.ensureDeferred
async def test_loaded_then_known_then_any_healthy_host(make: RigMaker) -> None:
    """The choice falls from hosts with the model loaded to hosts that know it, then to any
    healthy host, whatever their place in the route."""
    hosts = {
        "gpu-a": SimulatedHost({"tiny-z": "loaded"}),
        "gpu-b": SimulatedHost({"tiny-z": "loaded", "tiny-b": "unloaded"}),
        "gpu-c": SimulatedHost({"tiny-b": "loaded"}),
    }
    rig = await make(hosts)
    body = b'{"model": "tiny-b", "messages": [], "max_tokens": 1}'
    assert await hosts_answering(rig, 1, body) == ["gpu-c"]
    rig.crossbar.table.mark_down("gpu-c", "test")
    assert await hosts_answering(rig, 1, body) == ["gpu-b"]
    rig.crossbar.table.mark_down("gpu-b", "test")
    response, _ = await rig.post(CHAT, body)
    assert header(response, "x-crossbar-host") == "gpu-a"
    assert response.code == 400  # gpu-a's own answer: it does not have the model


@pytest_twisted.ensureDeferred
async def test_when_all_down_fail_answers_503(make: RigMaker) -> None:
    """With when_all_down: fail, a route whose hosts are all down answers 503 at once and
    sends nothing upstream."""
    rig = await make(sims("gpu-a", "gpu-b"), routes=route("priority", "fail", "gpu-a", "gpu-b"))
    for name in ("gpu-a", "gpu-b"):
        rig.crossbar.table.mark_down(name, "test")
    response, answer = await rig.post(CHAT, BODY)
    assert response.code == 503
    words = f"no healthy host for route lab: {DOWN}"
    assert json.loads(answer) == api_error(503, words)
    assert rig.completions("gpu-a") == rig.completions("gpu-b") == []


@pytest_twisted.ensureDeferred
async def test_when_all_down_try_all_tries_them_in_order(make: RigMaker) -> None:
    """With when_all_down: try_all, a route whose hosts are all marked down still tries them
    in the route's order; the first that answers serves the request."""
    rig = await make(sims("gpu-a", "gpu-b"), routes=route("priority", "try_all", "gpu-a", "gpu-b"))
    for name in ("gpu-a", "gpu-b"):
        rig.crossbar.table.mark_down(name, "test")
    response, _ = await rig.post(CHAT, BODY)
    assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-a")
    await rig.sims["gpu-a"].refuse()
    response, _ = await rig.post(CHAT, BODY)
    assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-b")
    assert rig.logs.matching("(tried gpu-a: connection refused, gpu-b)")


# -- 8. a failing host does not slow the others -----------------------------------------------


@pytest.mark.parametrize("failure", ["hang", "dark"])
@pytest_twisted.ensureDeferred
async def test_a_stuck_host_does_not_block_other_routes(
    make: RigMaker, hole: Any, failure: str
) -> None:
    """Twenty requests stuck on one host (it accepts and never answers, or its connects
    hang: its 4 slots taken, the others waiting in crossbar for them) do not slow requests
    routed to another host."""
    routes = {
        "slow": RouteConfig("slow", ("gpu-a",), "tiny-a"),
        "lab": RouteConfig("lab", ("gpu-b",), "tiny-a"),
    }
    stuck = fast(connect_timeout=30, header_timeout=30)
    rig = await make(sims("gpu-a", "gpu-b"), routes=routes, settings={"gpu-a": stuck})
    if failure == "hang":
        rig.sims["gpu-a"].fault = "hang"
    else:
        await go_dark(rig.sims["gpu-a"], hole)
    pending = []
    for _ in range(20):
        d = rig.client.post(rig.base + "/slow/v1/chat/completions", data=BODY)
        d.addErrback(lambda _: None)
        pending.append(d)
    in_flight, queue = rig.crossbar.traffic.in_flight, rig.crossbar.traffic.queue
    await eventually(
        lambda: (in_flight["gpu-a"], queue.waiting()) == (4, 16), 3.0, "20 stuck on gpu-a"
    )
    started = time.monotonic()
    assert await hosts_answering(rig, 10) == ["gpu-b"] * 10
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"10 requests to a good host took {elapsed:.2f}s"
    for d in pending:
        d.cancel()
    await DeferredList(pending)
    await eventually(lambda: in_flight["gpu-a"] == 0, 2.0, "stuck requests over")
    assert queue.waiting() == 0  # those that waited left at once too
    assert rig.state("gpu-a").healthy  # clients leaving is no fault of the host


@pytest_twisted.ensureDeferred
async def test_made_up_model_names_share_a_single_model_host_s_slots(make: RigMaker) -> None:
    """A single-model llama-server answers any name with its one model: six requests
    naming m0...m5 take its 2 slots and the other 4 wait in crossbar, as six naming its
    listed id would."""
    sim = SimulatedHost({"tiny-a.gguf": "loaded"}, router=False, slots=2)
    routes = {"lab": RouteConfig("lab", ("gpu-a",), None)}
    rig = await make({"gpu-a": sim}, routes=routes)
    await eventually(lambda: rig.state("gpu-a").slots == {"tiny-a.gguf": 2}, 3.0, "slots")
    sim.fault = "hang"
    pending = []
    for n in range(6):
        body = json.dumps({"model": f"m{n}", "messages": [{"role": "user", "content": "hi"}]})
        d = rig.client.post(rig.base + CHAT, data=body.encode())
        d.addErrback(lambda _: None)
        pending.append(d)
    traffic = rig.crossbar.traffic
    await eventually(
        lambda: (traffic.in_flight["gpu-a"], traffic.queue.waiting()) == (2, 4), 3.0, "2 and 4"
    )
    assert traffic.busy == {("gpu-a", "tiny-a.gguf"): 2}
    for d in pending:
        d.cancel()
    await DeferredList(pending)

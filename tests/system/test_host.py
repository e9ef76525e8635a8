"""The simulated llama-server on real loopback connections: connection closes, stream framing,
client disconnects, slow readers, refusals, resets and hangs, as the real one does them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlparse

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import error
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseNeverReceived

from crossbar.testing import SimulatedHost
from tests.support.simulatorclient import (
    TWO_MODELS,
    chat,
    sse_payloads,
    watch,
)


class RawClient(Protocol):
    """A bare TCP client: sees the exact bytes, and how the connection ended."""

    transport: Any

    def __init__(self, keep: bool = True) -> None:
        self.data = b""
        self.received = 0
        self.lost: Deferred[BaseException] = Deferred()  # fires with the reason
        self._keep = keep
        self._waiting: list[tuple[bytes, Deferred[None]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.received += len(data)
        self.data = self.data + data if self._keep else (self.data + data)[-64:]
        for marker, d in list(self._waiting):
            if marker in self.data:
                self._waiting.remove((marker, d))
                d.callback(None)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        assert reason.value is not None
        self.lost.callback(reason.value)

    def wait_for(self, marker: bytes) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if marker in self.data:
            d.callback(None)
        else:
            self._waiting.append((marker, d))
        return d


def client_reactor() -> Any:
    """The global reactor, for waits outside the fixtures."""
    from twisted.internet import reactor

    return reactor


async def send_raw(sim: SimulatedHost, request: bytes, keep: bool = True) -> RawClient:
    from twisted.internet import reactor

    port = urlparse(sim.url).port
    assert port is not None
    client = RawClient(keep)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), client)
    client.transport.write(request)
    return client


def http_post(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"Content-Type: application/json\r\n\r\n" + data


def http_chunks(raw: bytes) -> tuple[bytes, list[bytes]]:
    """Split a chunked HTTP response into its head and its chunks, one per server write."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    chunks = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    return head, chunks


@pytest_twisted.async_yield_fixture
async def hosts() -> AsyncIterator[Callable[..., SimulatedHost]]:
    """Makes simulated hosts, and stops every one of them at the end of the test."""
    made: list[SimulatedHost] = []

    def make(**kwargs: Any) -> SimulatedHost:
        made.append(SimulatedHost(**kwargs))
        return made[-1]

    yield make
    for sim in made:
        await sim.stop()


@pytest_twisted.async_yield_fixture
async def http(reactor: Any) -> AsyncIterator[HTTPClient]:
    """A treq client over real sockets that keeps no connection around."""
    pool = HTTPConnectionPool(reactor, persistent=False)
    yield HTTPClient(Agent(reactor, pool=pool))
    await pool.closeCachedConnections()


# -- answers ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_completions_close_the_connection_unless_told_not_to(
    hosts: Callable[..., SimulatedHost],
) -> None:
    sim = hosts(models=TWO_MODELS)
    await sim.listen()
    client = await send_raw(sim, http_post("/v1/chat/completions", chat()))
    await client.lost
    assert b"Connection: close" in client.data and b"Keep-Alive: timeout=5" in client.data
    # What a router relays comes chunked, with no length, and unbuffered.
    head, chunks = http_chunks(client.data)
    assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
    assert b"X-Accel-Buffering: no" in head and head.count(b"Connection: close") == 1
    assert json.loads(b"".join(chunks))["object"] == "chat.completion"
    sim.close_completions = False
    client = await send_raw(sim, http_post("/v1/chat/completions", chat()))
    await client.wait_for(b'"usage"')
    assert b"Connection: close" not in client.data and sim.open_connections == 1


@pytest_twisted.ensureDeferred
async def test_errors_close_the_connection_and_answers_allow_any_origin(
    hosts: Callable[..., SimulatedHost],
) -> None:
    sim = hosts(models=TWO_MODELS)
    await sim.listen()
    client = await send_raw(sim, http_post("/v1/chat/completions", chat("nope")))
    reason = await client.lost
    assert isinstance(reason, error.ConnectionDone)
    head = client.data.partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 400")
    assert b"Connection: close" in head and b"Keep-Alive" not in head
    assert b"Content-Length: 88" in head
    client = await send_raw(sim, b"GET /health HTTP/1.1\r\nHost: sim\r\n\r\n")
    await client.wait_for(b'{"status":"ok"}')
    head = client.data.partition(b"\r\n\r\n")[0]
    assert b"Keep-Alive: timeout=5, max=100" in head and b"Connection: close" not in head
    assert b"Access-Control-Allow-Origin: \r\n" in head and b"Server: llama.cpp" in head
    assert sim.open_connections == 1


# -- streaming over real sockets ----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_stream_framing_matches_llama(hosts: Callable[..., SimulatedHost]) -> None:
    sim = hosts(models=TWO_MODELS, chunk_interval=0.001)
    await sim.listen()
    body = chat(stream=True, max_tokens=5, stream_options={"include_usage": True})
    client = await send_raw(sim, http_post("/v1/chat/completions", body))
    reason = await client.lost
    assert isinstance(reason, error.ConnectionDone)  # the router closes after completions
    head, chunks = http_chunks(client.data)
    for line in (b"Content-Type: text/event-stream", b"X-Accel-Buffering: no"):
        assert line in head
    assert b"Transfer-Encoding: chunked" in head and b"Connection: close" in head
    events = [sse_payloads(chunk) for chunk in chunks]
    assert all(len(event) == 1 for event in events)  # one SSE event per write
    payloads = [event[0] for event in events]
    assert payloads[-1] == "[DONE]"
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = [p["choices"][0]["delta"]["content"] for p in payloads[1:6]]
    assert content == ["a", "b", "c", "d", "e"]
    assert all(p["object"] == "chat.completion.chunk" for p in payloads[:-1])
    assert payloads[6]["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
    assert "timings" not in payloads[6]  # with include_usage they come with the usage
    assert payloads[7]["choices"] == [] and payloads[7]["usage"]["completion_tokens"] == 5
    assert "timings" in payloads[7]
    assert len(payloads) == 9
    assert list(payloads[1]) == [
        "choices",
        "created",
        "id",
        "model",
        "system_fingerprint",
        "object",
    ]
    assert len({p["id"] for p in payloads[:-1]}) == 1


@pytest_twisted.ensureDeferred
async def test_client_disconnect_stops_generation(hosts: Callable[..., SimulatedHost]) -> None:
    sim = hosts(models=TWO_MODELS, chunks=1000, chunk_interval=0.01)
    await sim.listen()
    body = chat(stream=True)
    client = await send_raw(sim, http_post("/v1/chat/completions", body))
    await client.wait_for(b'"content":"c"')
    assert sim.active_streams == 1 and sim.open_connections == 1
    closed = sim.wait_connection_closed()
    client.transport.abortConnection()
    await closed
    assert sim.active_streams == 0 and sim.open_connections == 0
    sent = sim.chunks_sent
    assert sent < 1000
    await deferLater(client_reactor(), 0.05)
    assert sim.chunks_sent == sent


@pytest_twisted.ensureDeferred
async def test_slow_reader_pauses_generation(hosts: Callable[..., SimulatedHost]) -> None:
    size = 64 * 1024
    sim = hosts(models=TWO_MODELS, chunks=512, chunk_size=size)
    await sim.listen()
    body = chat(stream=True)  # 32 MiB of content
    client = await send_raw(sim, http_post("/v1/chat/completions", body), keep=False)
    client.transport.pauseProducing()  # stop reading: the simulator must stop too
    await deferLater(client_reactor(), 0.2)
    assert 0 < sim.chunks_sent < 200 and sim.active_streams == 1
    client.transport.resumeProducing()
    await client.lost
    assert client.data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert client.received > 512 * size and sim.chunks_sent == 512


# -- faults -------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_refuse_then_listen_on_the_same_port(
    hosts: Callable[..., SimulatedHost], http: HTTPClient
) -> None:
    sim = hosts(models=TWO_MODELS)
    listening: Any = await sim.listen()
    port = listening.getHost().port
    url = sim.url
    assert (await http.get(url + "/health")).code == 200
    await sim.refuse()
    with pytest.raises(error.ConnectionRefusedError):
        await http.get(url + "/health")
    listening = await sim.listen()
    assert listening.getHost().port == port and sim.url == url
    response = await http.get(url + "/health")
    assert await response.json() == {"status": "ok"}


@pytest_twisted.ensureDeferred
async def test_reset_aborts_a_stream_after_some_chunks(hosts: Callable[..., SimulatedHost]) -> None:
    sim = hosts(models=TWO_MODELS)
    await sim.listen()
    sim.fault = "reset"
    client = await send_raw(sim, http_post("/v1/chat/completions", chat(stream=True)))
    reason = await client.lost
    assert not isinstance(reason, error.ConnectionDone)
    head, chunks = http_chunks(client.data)
    assert head.startswith(b"HTTP/1.1 200")
    assert len(chunks) == 1 + sim.reset_after and b"[DONE]" not in client.data


@pytest_twisted.ensureDeferred
async def test_reset_and_close_answer_nothing_to_plain_requests(
    hosts: Callable[..., SimulatedHost],
) -> None:
    sim = hosts(models=TWO_MODELS)
    await sim.listen()
    for fault, ending in (("reset", error.ConnectionLost), ("close", error.ConnectionDone)):
        sim.fault = fault  # type: ignore[assignment]
        client = await send_raw(sim, b"GET /health HTTP/1.1\r\nHost: sim\r\n\r\n")
        reason = await client.lost
        assert client.data == b"" and isinstance(reason, ending), (fault, reason)
    assert sim.paths() == ["/health", "/health"]


@pytest_twisted.ensureDeferred
async def test_hang_never_answers(hosts: Callable[..., SimulatedHost], http: HTTPClient) -> None:
    sim = hosts(models=TWO_MODELS)
    await sim.listen()
    sim.fault = "hang"
    received = sim.wait_request()
    answer = http.post(sim.url + "/v1/chat/completions", json=chat())
    answered = watch(answer)
    assert (await received).path == "/v1/chat/completions"
    await deferLater(client_reactor(), 0.1)
    assert not answered and sim.open_connections == 1
    closed = sim.wait_connection_closed()
    answer.cancel()
    with pytest.raises(ResponseNeverReceived) as raised:
        await answer
    assert raised.value.reasons[0].check(CancelledError)
    await closed
    assert sim.open_connections == 0

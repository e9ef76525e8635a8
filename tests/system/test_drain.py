"""Stopping without cutting answers: the ports close at once, readyz says 503, requests in
flight finish for up to ``drain_timeout``, then what is left is cut and crossbar exits 0."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
import treq
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from crossbar.config import Config
from crossbar.testing import RigMaker, SimulatedHost, broken, eventually, guard, rigs
from crossbar.testing.timeouts import turns
from tests.support import Daemon, accepts, raw_request, start_daemon, start_simulator

CHAT = "/lab/v1/chat/completions"
STREAM = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


def drain_after(seconds: float) -> Any:
    def adjust(config: Config) -> Config:
        return attrs.evolve(config, drain_timeout=seconds)

    return adjust


def whole_stream(reader_data: bytes) -> bool:
    return b"[DONE]" in reader_data


@pytest_twisted.ensureDeferred
async def test_a_stream_in_flight_finishes_while_the_port_is_closed(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost(chunks=20, chunk_interval=0.03)})
    port = rig.port
    response, reader = await rig.stream(CHAT, STREAM)
    assert response.code == 200
    await guard(reader.bytes(1), 2, "first chunk")
    stopping = Deferred.fromCoroutine(rig.crossbar.drain())
    await turns(2)  # Twisted closes a port on its next turn
    assert not accepts(port)  # refused at once, not after the drain
    pages = StubTreq(rig.crossbar.status.resource())
    ready = await pages.get("http://crossbar/readyz")
    assert ready.code == 503
    assert json.loads(await treq.content(ready)) == {
        "ready": False,
        "draining": True,
        "routes_down": [],
    }
    await guard(stopping, 5, "drain")
    assert not broken(await reader.end())
    assert whole_stream(reader.data)
    assert rig.logs.matching("stopping: waiting up to 30s for 1 request in flight")
    assert rig.logs.matching("stopped: 1 request finished")


@pytest_twisted.ensureDeferred
async def test_past_drain_timeout_the_stream_is_cut_and_the_host_stops(make: RigMaker) -> None:
    sim = SimulatedHost(chunks=100_000, chunk_interval=0.01)
    rig = await make({"gpu-a": sim}, adjust=drain_after(0.3))
    _, reader = await rig.stream(CHAT, STREAM)
    await guard(reader.bytes(1), 2, "first chunk")
    started = time.monotonic()
    await guard(Deferred.fromCoroutine(rig.crossbar.drain()), 3, "drain")
    assert 0.25 < time.monotonic() - started < 2
    assert broken(await reader.end(2))
    assert not whole_stream(reader.data)
    await eventually(lambda: sim.active_streams == 0, 2, "upstream closed")
    assert rig.logs.matching("stopped: 1 request cut off after 0.3s")


@pytest_twisted.ensureDeferred
async def test_an_idle_kept_alive_connection_is_closed_at_once(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    sock = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    sock.sendall(b"GET /_crossbar/livez HTTP/1.1\r\nHost: crossbar\r\n\r\n")
    first = await deferToThread(_read_answer, sock)
    assert first.startswith(b"HTTP/1.1 200")
    await guard(Deferred.fromCoroutine(rig.crossbar.drain()), 2, "drain")
    assert await deferToThread(sock.recv, 65536) == b""  # closed, not left to time out
    sock.close()
    assert rig.logs.matching("stopping: no request in flight")


@pytest_twisted.ensureDeferred
async def test_a_first_request_on_its_way_as_the_drain_begins_is_answered(
    make: RigMaker,
) -> None:
    """Its client connected before the port closed: it has nowhere else to send it."""
    rig = await make({"gpu-a": SimulatedHost(chunks=20, chunk_interval=0.03)})
    _, reader = await rig.stream(CHAT, STREAM)
    await guard(reader.bytes(1), 2, "first chunk")
    sock = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    sock.sendall(b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: crossbar\r\n")
    await eventually(lambda: rig.crossbar.site.open_connections == 2, 2, "second connection")
    stopping = Deferred.fromCoroutine(rig.crossbar.drain())
    await turns(2)
    body = json.dumps({"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]})
    sock.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
    answer = await deferToThread(_read_all, sock)  # read to the end: the answer closes it
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"Connection: close" in answer
    await guard(stopping, 5, "drain")
    assert rig.logs.matching("stopped: 2 requests finished")


def one_slot(config: Config) -> Config:
    hosts = {name: attrs.evolve(host, slots=1) for name, host in config.hosts.items()}
    return attrs.evolve(config, hosts=hosts)


@pytest_twisted.ensureDeferred
async def test_a_first_request_finding_every_slot_busy_is_told_at_once(make: RigMaker) -> None:
    """A connection accepted as the drain begins, whose first request would wait for a
    slot held by a stream that outlasts it: 503 at once, not an answer held for as long as
    the stream goes on (or until the drain cuts it)."""
    rig = await make({"gpu-a": SimulatedHost(chunks=60, chunk_interval=0.05)}, adjust=one_slot)
    _, reader = await rig.stream(CHAT, STREAM)  # 3 s of answer, in the one slot
    await guard(reader.bytes(1), 2, "first chunk")
    port = rig.port  # closed once the drain begins
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    await eventually(lambda: rig.crossbar.site.open_connections == 2, 2, "second connection")
    stopping = Deferred.fromCoroutine(rig.crossbar.drain())
    await turns(2)
    started = time.monotonic()
    sock.sendall(raw_request(port, CHAT, b'{"model": "tiny-a", "prompt": "hi"}'))
    answer = await deferToThread(_read_all, sock)
    assert time.monotonic() - started < 1.5
    assert answer.startswith(b"HTTP/1.1 503")  # and closed: read to its end
    assert b"crossbar is stopping" in answer
    await guard(stopping, 10, "drain")
    assert whole_stream(reader.data)


@pytest_twisted.ensureDeferred
async def test_a_further_request_on_a_kept_alive_connection_is_told_to_go_elsewhere(
    make: RigMaker,
) -> None:
    """Sent in the race with the connection's closing: 503, and the connection closes."""
    rig = await make({"gpu-a": SimulatedHost()})
    sock = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    sock.sendall(raw_request(rig.port, CHAT, b'{"model": "tiny-a", "prompt": "hi"}'))
    first = await deferToThread(_read_answer, sock)
    assert first.startswith(b"HTTP/1.1 200")
    channel = next(iter(rig.crossbar.site.channels))
    rig.crossbar.site.draining = True  # what drain() sets first, before closing it
    channel.dataReceived(raw_request(rig.port, CHAT, b"{}"))
    answer = await deferToThread(_read_all, sock)
    assert answer.startswith(b"HTTP/1.1 503")
    assert b"Connection: close" in answer
    assert answer.endswith(
        b'{"error":{"message":"shutting down","type":"unavailable_error","code":503}}'
    )
    rig.crossbar.site.draining = False


def _read_answer(sock: socket.socket) -> bytes:
    """One chunked answer, to its last chunk; the connection left open."""
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        data += sock.recv(65536)
    return data


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


# -- the daemon, as a service manager stops it --------------------------------------------------


def _stream_through(port: int) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(raw_request(port, CHAT, json.dumps(STREAM).encode()))
    return _read_all(sock)


@contextlib.contextmanager
def _streaming(
    tmp_path: Path, chunks: int, extra: str = ""
) -> Iterator[tuple[Daemon, Future[bytes]]]:
    """crossbar under ``twistd`` before a simulator answering in ``chunks`` (one every
    50 ms), and the answer to one stream through it, under way."""
    sim = start_simulator(tmp_path, "--chunks", str(chunks), "--chunk-interval", "0.05")
    crossbar = None
    try:
        crossbar = start_daemon(
            tmp_path,
            f"poll_interval: 1h\n{extra}hosts:\n  gpu-a: {sim.url}\n"
            "routes:\n  lab:\n    hosts: [gpu-a]\n    default_model: tiny-a\n",
        )
        up = crossbar.wait(lambda: "host gpu-a is up" in crossbar.output(), 10)
        assert up, crossbar.log()
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(_stream_through, crossbar.port)
            assert crossbar.wait(lambda: _streams(crossbar.url) == 1, 5), crossbar.log()
            yield crossbar, answer
    finally:
        if crossbar is not None:
            crossbar.stop()
        sim.stop()


def test_sigterm_lets_the_stream_finish_and_exits_0(tmp_path: Path) -> None:
    with _streaming(tmp_path, chunks=30) as (crossbar, answer):  # 1.5 s of answer
        crossbar.proc.terminate()
        assert crossbar.wait(lambda: not accepts(crossbar.port), 0.5), "still accepting"
        data = answer.result(timeout=10)
        assert data.startswith(b"HTTP/1.1 200")
        assert b"[DONE]" in data and data.endswith(b"0\r\n\r\n")
        assert crossbar.proc.wait(timeout=10) == 0
    log = crossbar.output()
    assert "stopping: waiting up to 30s for 1 request in flight" in log
    assert "stopped: 1 request finished" in log


def test_drain_timeout_cuts_a_longer_stream_and_still_exits_0(tmp_path: Path) -> None:
    with _streaming(tmp_path, chunks=400, extra="drain_timeout: 1s\n") as (crossbar, answer):
        started = time.monotonic()
        assert crossbar.terminate(timeout=10) == 0
        assert time.monotonic() - started < 5
        data = answer.result(timeout=10)
    assert data.startswith(b"HTTP/1.1 200") and b"[DONE]" not in data
    log = crossbar.output()
    assert "stopping: waiting up to 1s for 1 request in flight" in log
    assert "stopped: 1 request cut off after 1s" in log


def _streams(base: str) -> int:
    """Requests in flight, as the status page counts them."""
    try:
        with urllib.request.urlopen(base + "/_crossbar/status", timeout=2) as r:
            hosts = json.loads(r.read())["hosts"]
    except OSError:
        return -1
    return sum(int(h["in_flight"]) for h in hosts.values())

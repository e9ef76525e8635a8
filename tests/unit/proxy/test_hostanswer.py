"""crossbar.proxy.hostanswer: a host's answer relayed to the client (its status, headers
and body, and what it says of its work), in memory (crossbar.testing.MemoryProxy)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.config import parse_config
from crossbar.testing import ClientLine, HostLine, MemoryProxy
from tests.support.exchange import BODY as STREAMED
from tests.support.exchange import END, HEAD, ask, chunk, config

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture
def proxy() -> MemoryProxy:
    config = parse_config({
        "hosts": {"gpu-a": "http://127.0.0.1:18081"},
        "routes": {"lab": {"hosts": ["gpu-a"]}},
        "idle_timeout": 30,
    })  # fmt: skip
    return MemoryProxy(config, models=("m",))


def test_the_host_s_status_headers_and_body_reach_the_client_with_the_host_named(
    proxy: MemoryProxy,
) -> None:
    client = proxy.client()
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        % len(BODY)
    )
    client.send(BODY)
    answer = b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}'
    head = b"HTTP/1.1 201 Created\r\nX-Custom: kept\r\nContent-Length: %d\r\n\r\n" % len(answer)
    proxy.accept().send(head + answer)
    received = client.received.lower()
    assert received.startswith(b"http/1.1 201 created\r\n")
    assert b"x-custom: kept" in received and b"x-crossbar-host: gpu-a" in received
    assert client.received.endswith(answer)
    [record] = proxy.records
    assert (record.status, record.sent, record.prompt_tokens) == (201, len(answer), 9)


def test_a_host_quiet_before_any_body_is_a_504_and_its_connection_closed(
    proxy: MemoryProxy,
) -> None:
    client = proxy.client()
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        % len(BODY)
    )
    client.send(BODY)
    host = proxy.accept()
    host.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    proxy.clock.advance(31)
    assert client.received.startswith(b"HTTP/1.1 504 ") and host.closed
    assert proxy.records[-1].status == 504


# -- failover until the first content ----------------------------------------------------------

PING = b": ping\n\n"
ROLE = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
WORDS = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


@pytest.fixture
def pair() -> MemoryProxy:
    return MemoryProxy(config(idle_timeout=60), models=("m",))


def broken(host: HostLine, clock: Any) -> None:
    """The host's connection breaks mid-body (a chunked body never ended)."""
    host.close()
    clock.advance(0)


def pinged_then_broken(pair: MemoryProxy) -> ClientLine:
    """A streamed request whose first host sends its head and a ping, then breaks."""
    client = ask(pair)
    gpu_a = pair.accept()
    gpu_a.send(HEAD + chunk(PING))
    broken(gpu_a, pair.clock)
    return client


def test_a_host_that_breaks_after_its_head_and_a_ping_is_replaced_in_the_same_stream(
    pair: MemoryProxy,
) -> None:
    client = pinged_then_broken(pair)
    assert client.received.startswith(b"HTTP/1.1 200 OK") and client.received.endswith(chunk(PING))
    assert not client.closed
    state = pair.table.get("gpu-a")
    assert state is not None and not state.healthy  # a break marks the host down
    gpu_b = pair.accept()
    assert gpu_b.host == "gpu-b"
    gpu_b.send(HEAD + chunk(PING) + chunk(ROLE) + chunk(WORDS) + END)
    received = client.received
    assert received.count(b"HTTP/1.1 ") == 1  # gpu-b's head was dropped
    body = received.partition(b"\r\n\r\n")[2]
    assert ROLE in body and WORDS in body and body.count(ROLE) == 1
    [record] = pair.records
    assert (record.status, record.host, record.tried) == (200, "gpu-b", ("gpu-a", "gpu-b"))
    assert not record.cut_off
    [note] = [n for n in record.notes() if n.startswith("tried ")]
    assert note.startswith("tried gpu-a: broke before any content") and note.endswith(", gpu-b")


def test_a_host_that_breaks_after_its_head_alone_is_replaced_and_the_head_names_the_next(
    pair: MemoryProxy,
) -> None:
    client = ask(pair)
    gpu_a = pair.accept()
    gpu_a.send(HEAD)
    assert client.received == b""  # a head is not content: held
    broken(gpu_a, pair.clock)
    pair.accept().send(HEAD + chunk(ROLE) + END)
    assert client.received.startswith(b"HTTP/1.1 200 OK")
    assert b"x-crossbar-host: gpu-b" in client.received.lower()


def test_an_error_event_before_any_content_is_tried_on_the_next_host(pair: MemoryProxy) -> None:
    client = ask(pair)
    gpu_a = pair.accept()
    gpu_a.send(HEAD + chunk(b'data: {"error":{"code":500,"message":"oops"}}\n\n'))
    assert client.received == b"" and gpu_a.closed
    pair.accept().send(HEAD + chunk(ROLE) + END)
    assert b"oops" not in client.received and client.received.endswith(chunk(ROLE) + END)
    assert pair.records[0].failures == (("gpu-a", "an error event before any content"),)
    state = pair.table.get("gpu-a")
    assert state is not None and state.healthy  # the request failed there, not the host


def test_a_host_that_breaks_after_its_first_content_is_cut_off_not_retried(
    pair: MemoryProxy,
) -> None:
    client = ask(pair)
    gpu_a = pair.accept()
    gpu_a.send(HEAD + chunk(PING) + chunk(ROLE))
    broken(gpu_a, pair.clock)
    assert client.closed and pair.waiting == []
    [record] = pair.records
    assert record.cut_off and record.tried == ("gpu-a",)
    assert "answer cut off" in record.notes()


def test_a_non_streamed_5xx_is_tried_on_the_next_host(pair: MemoryProxy) -> None:
    client = ask(pair, STREAMED.replace(b"true", b"false"))
    words = b'{"error":{"message":"busy"}}'
    pair.accept().send(b"HTTP/1.1 503 Busy\r\nContent-Length: %d\r\n\r\n%s" % (len(words), words))
    answer = b'{"choices":[]}'
    pair.accept().send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
    assert client.received.startswith(b"HTTP/1.1 200 OK") and client.received.endswith(answer)
    assert pair.records[0].failures == (("gpu-a", "answered 503"),)


def test_a_non_streamed_answer_broken_before_its_body_is_tried_on_the_next_host(
    pair: MemoryProxy,
) -> None:
    client = ask(pair, STREAMED.replace(b"true", b"false"))
    gpu_a = pair.accept()
    gpu_a.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    broken(gpu_a, pair.clock)
    answer = b'{"choices":[]}'
    pair.accept().send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
    assert client.received.startswith(b"HTTP/1.1 200 OK") and client.received.endswith(answer)
    assert client.received.count(b"HTTP/1.1") == 1


@pytest.mark.parametrize(
    ("path", "event"),
    [
        (b"/lab/v1/chat/completions", b'data: {"error": {"message": "upstream failed'),
        (
            b"/lab/v1/messages",
            b'event: error\ndata: {"type": "error", "error": {"type": "api_error"',
        ),
        (b"/lab/v1/responses", b'event: error\ndata: {"type": "error", "code": "server_error"'),
    ],
)
def test_when_every_host_fails_after_a_ping_went_out_the_stream_ends_with_an_error_event(
    pair: MemoryProxy, path: bytes, event: bytes
) -> None:
    body = b'{"model":"m","stream":true,"input":"hi","messages":[{"role":"user","content":"hi"}]}'
    client = ask(pair, body, path)
    for _ in range(2):
        host = pair.accept()
        host.send(HEAD + chunk(PING))
        broken(host, pair.clock)
    received = client.received
    assert received.startswith(b"HTTP/1.1 200 OK") and received.count(b"HTTP/1.1") == 1
    assert event in received and received.endswith(END)
    [record] = pair.records
    assert record.status == 200 and record.tried == ("gpu-a", "gpu-b")
    assert record.reason is not None and record.reason.startswith("upstream failed")


def test_every_host_failing_before_any_head_went_out_is_today_s_json_error(
    pair: MemoryProxy,
) -> None:
    client = ask(pair)
    for _ in range(2):
        host = pair.accept()
        host.send(HEAD)
        broken(host, pair.clock)
    assert client.received.startswith(b"HTTP/1.1 502 ")
    assert b"upstream failed" in client.received


def test_a_4xx_after_another_host_s_head_went_out_never_enters_the_stream(
    pair: MemoryProxy,
) -> None:
    client = pinged_then_broken(pair)
    words = b'{"error":{"message":"bad"}}'
    pair.accept().send(b"HTTP/1.1 404 No\r\nContent-Length: %d\r\n\r\n%s" % (len(words), words))
    received = client.received
    assert words not in received and received.count(b"HTTP/1.1") == 1
    assert b'data: {"error": {"message": "upstream failed' in received


def list_models(proxy: MemoryProxy, listing: bytes) -> bytes:
    """A forwarded ``GET /lab/v1/models`` that the host answers with ``listing``; the body
    the client got."""
    client = proxy.client()
    client.send(b"GET /lab/v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    proxy.accept().send(head % len(listing) + listing)
    return client.received.partition(b"\r\n\r\n")[2]


LISTING = b'{"object":"list","data":[{"id":"m","object":"model"},{"id":"other","object":"model"}]}'


def test_a_forwarded_model_list_carries_the_windows_crossbar_knows_of_that_host(
    proxy: MemoryProxy,
) -> None:
    proxy.table.record_window("gpu-a", "m", 16384)
    got = json.loads(list_models(proxy, LISTING))
    m, other = got["data"]
    assert m["context_length"] == m["max_input_tokens"] == m["context_window"] == 16384
    assert "context_length" not in other  # no window known: as the host said it
    assert proxy.records[-1].status == 200 and proxy.records[-1].host == "gpu-a"


@pytest.mark.parametrize(
    ("window", "listing"),
    [(None, LISTING), (16384, b'{"models": "not a list"}'), (16384, b"not json")],
)
def test_a_model_list_with_no_window_known_or_not_a_list_goes_as_it_came(
    proxy: MemoryProxy, window: int | None, listing: bytes
) -> None:
    proxy.table.record_window("gpu-a", "m", window)
    assert list_models(proxy, listing) == listing

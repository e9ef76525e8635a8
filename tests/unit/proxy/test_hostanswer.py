"""crossbar.proxy.hostanswer: a host's answer relayed to the client (its status, headers
and body, and what it says of its work), in memory (crossbar.testing.MemoryProxy)."""

from __future__ import annotations

import pytest

from crossbar.config import parse_config
from crossbar.testing import MemoryProxy

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

"""crossbar.testing.memory: the proxy in memory, and the hosts a test plays, behave as
sockets would where a test relies on it."""

from __future__ import annotations

from crossbar.config import parse_config
from crossbar.testing import MemoryProxy

CONFIG = parse_config(
    {
        "hosts": {"gpu-a": "http://127.0.0.1:18081", "gpu-b": "http://127.0.0.1:18082"},
        "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"]}},
    }
)
ASK = b"GET /lab/v1/models HTTP/1.1\r\nHost: c\r\n\r\n"


def test_connections_wait_until_the_test_accepts_or_refuses_them() -> None:
    proxy = MemoryProxy(CONFIG)
    assert proxy.waiting == []
    proxy.client().send(ASK)
    assert proxy.waiting == ["gpu-a"]
    assert proxy.refuse() == "gpu-a"
    assert proxy.waiting == ["gpu-b"]
    line = proxy.accept()
    assert (line.host, proxy.waiting) == ("gpu-b", [])
    assert line.received.startswith(b"GET /v1/models HTTP/1.1\r\n")


def test_a_close_reaches_the_other_side_on_the_clock_s_next_turn() -> None:
    proxy = MemoryProxy(CONFIG)
    client = proxy.client()
    client.send(ASK)
    line = proxy.accept()
    client.leave()
    assert client.closed and not line.closed and proxy.records == []
    proxy.clock.advance(0)
    assert line.closed and [r.status for r in proxy.records] == [499]


def test_every_host_starts_healthy_with_the_models_given() -> None:
    proxy = MemoryProxy(CONFIG, models=("m",))
    for name in ("gpu-a", "gpu-b"):
        state = proxy.table.get(name)
        assert state is not None and state.healthy and state.loaded == ("m",)

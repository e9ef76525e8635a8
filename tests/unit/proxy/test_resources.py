"""crossbar.proxy.resources: everything under the root is proxied, one exchange a request,
except the children put on the root (``/_crossbar/``)."""

from __future__ import annotations

from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyRequest

from crossbar.config import parse_config
from crossbar.proxy.resources import RootResource
from crossbar.testing import MemoryProxy

CONFIG = parse_config(
    {
        "hosts": {"gpu-a": "http://127.0.0.1:18081"},
        "routes": {"lab": {"hosts": ["gpu-a"]}},
    }
)


def test_any_path_under_the_root_is_the_proxy_s() -> None:
    proxy = Resource()
    root = RootResource(proxy)
    for segment in (b"lab", b"v1", b"", b"anything"):
        assert root.getChildWithDefault(segment, DummyRequest([segment])) is proxy


def test_a_child_put_on_the_root_is_not_proxied() -> None:
    pages = Resource()
    root = RootResource(Resource())
    root.putChild(b"_crossbar", pages)
    assert root.getChildWithDefault(b"_crossbar", DummyRequest([b"_crossbar"])) is pages


def test_each_request_is_one_exchange_sent_to_a_host() -> None:
    proxy = MemoryProxy(CONFIG, models=("m",))
    first = proxy.client()
    first.send(b"GET /lab/v1/models HTTP/1.1\r\nHost: crossbar\r\n\r\n")
    host = proxy.accept()
    assert host.received.startswith(b"GET /v1/models HTTP/1.1\r\n")
    host.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert first.received.endswith(b"\r\n\r\n{}")
    second = proxy.client()  # another client: its own exchange, on the kept-alive connection
    second.send(b"GET /lab/v1/models HTTP/1.1\r\nHost: crossbar\r\n\r\n")
    assert host.received.count(b"GET /v1/models HTTP/1.1\r\n") == 2
    host.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n[{}]")
    assert second.received.endswith(b"\r\n\r\n[{}]")
    assert len(proxy.records) == 2


def test_a_request_refused_on_its_head_reaches_no_host() -> None:
    proxy = MemoryProxy(CONFIG, models=("m",))
    client = proxy.client()
    client.send(b"GET /lab/v1/models HTTP/1.1\r\nHost: crossbar\r\nTransfer-Encoding: gzip\r\n\r\n")
    assert client.received.startswith(b"HTTP/1.1 4")
    assert proxy.waiting == []

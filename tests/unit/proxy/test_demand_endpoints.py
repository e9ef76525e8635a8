"""crossbar.proxy.demand: what a request asks, read from its path and body, as the hosts
then see it: the model entry asked of a host that has the model, llama-server's own
stateless endpoints routed by their body's model with the route's default filled in, and
the resumable stream sessions still closed. In memory (crossbar.testing.MemoryProxy)."""

from __future__ import annotations

import json

import pytest

from crossbar.config import parse_config
from crossbar.testing import ClientLine, MemoryProxy
from tests.support.errors import api_error


def proxy(**route: object) -> MemoryProxy:
    """``gpu-a`` lists model ``x``, ``gpu-b`` model ``m``."""
    config = parse_config(
        {
            "hosts": {"gpu-a": "http://127.0.0.1:18081", "gpu-b": "http://127.0.0.1:18082"},
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], **route}},
        }
    )
    memory = MemoryProxy(config, models=("m",))
    memory.table.record_ok("gpu-a", ("x",), ("x",))
    return memory


def send(memory: MemoryProxy, method: bytes, path: bytes, body: bytes = b"") -> ClientLine:
    client = memory.client()
    length = b"Content-Length: %d\r\n" % len(body) if body or method == b"POST" else b""
    client.send(b"%s %s HTTP/1.1\r\nHost: c\r\n%s\r\n%s" % (method, path, length, body))
    return client


def test_a_model_entry_is_asked_of_a_host_that_has_the_model() -> None:
    """The SDKs' ``models.retrieve("m")``: to the host listing ``m``, not the first one."""
    memory = proxy()
    send(memory, b"GET", b"/lab/v1/models/m")
    host = memory.accept()
    assert host.host == "gpu-b"
    assert host.received.startswith(b"GET /v1/models/m HTTP/1.1\r\n")


@pytest.mark.parametrize(
    "rest",
    [b"/infill", b"/completion", b"/tokenize", b"/detokenize", b"/apply-template",
     b"/embedding", b"/embeddings", b"/rerank", b"/reranking", b"/v1/rerank"],
)  # fmt: skip
def test_llama_server_s_own_endpoints_go_by_the_body_s_model(rest: bytes) -> None:
    memory = proxy()
    send(memory, b"POST", b"/lab" + rest, b'{"model":"m","content":"def f():"}')
    host = memory.accept()
    assert host.host == "gpu-b"
    assert host.received.startswith(b"POST %s HTTP/1.1\r\n" % rest)


def test_a_native_body_without_a_model_gets_the_route_s_default() -> None:
    memory = proxy(default_model="m")
    send(memory, b"POST", b"/lab/infill", b'{"input_prefix":"def f():","input_suffix":""}')
    host = memory.accept()
    body = json.loads(host.received.partition(b"\r\n\r\n")[2])
    assert host.host == "gpu-b" and body["model"] == "m"
    assert memory.records == [] or memory.records[-1].model == "m"


@pytest.mark.parametrize("rest", [b"/v1/stream", b"/v1/streams/lookup", b"/slots", b"/slots/0"])
def test_the_stream_sessions_and_the_host_s_own_state_stay_closed(rest: bytes) -> None:
    memory = proxy()
    client = send(memory, b"POST", b"/lab" + rest, b"{}")
    head, _, body = client.received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 ")
    assert json.loads(body)["error"]["type"] == api_error(404, "")["error"]["type"]  # type: ignore[index]
    assert memory.waiting == []

"""A request through a ``MemoryProxy`` in bytes: a streamed chat request, a host's answer
head and events in chunks, and the two-host config it runs on."""

from __future__ import annotations

from typing import Any

from crossbar.config import Config, parse_config
from crossbar.testing import ClientLine, MemoryProxy

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b"data: {}\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


END = b"0\r\n\r\n"


def config(policy: str = "priority", **settings: Any) -> Config:
    return parse_config(
        {
            "hosts": {"gpu-a": "http://127.0.0.1:18081", "gpu-b": "http://127.0.0.1:18082"},
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "policy": policy}},
            **settings,
        }
    )


def ask(
    proxy: MemoryProxy, body: bytes = BODY, path: bytes = b"/lab/v1/chat/completions"
) -> ClientLine:
    client = proxy.client()
    head = b"POST %s HTTP/1.1\r\nHost: crossbar\r\nContent-Length: %d\r\n\r\n" % (path, len(body))
    client.send(head + body)
    return client

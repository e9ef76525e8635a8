"""Routing by fit in the exchange, without sockets (crossbar.testing.MemoryProxy): a prompt
too long for a host's window goes to one it fits, a host's refusal is tried elsewhere and
teaches the window, and a prompt no host holds is answered in its API's own words. The
access line and the JSON log say so."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.config import parse_config
from crossbar.logformat import json_line
from crossbar.stats.accessline import access_line
from crossbar.testing import ClientLine, HostLine, MemoryProxy

OK = b'{"choices":[],"usage":{"prompt_tokens":2600,"completion_tokens":1}}'


def refusal(tokens: int, window: int) -> bytes:
    """llama-server's answer to a prompt longer than its slot, as it sends it."""
    body = json.dumps({"error": {
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": tokens,
        "n_ctx": window, "message": f"request ({tokens} tokens) exceeds the available context"
        f" size ({window} tokens), try increasing it",
    }}).encode()  # fmt: skip
    head = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def answer(body: bytes = OK, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


@pytest.fixture
def proxy() -> MemoryProxy:
    config = parse_config({
        "hosts": {"gpu-a": "http://127.0.0.1:18081", "gpu-b": "http://127.0.0.1:18082"},
        "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "policy": "priority"}},
        "header_timeout": 60, "idle_timeout": 30,
    })  # fmt: skip
    return MemoryProxy(config, models=("m",))


def ask(proxy: MemoryProxy, words: int, path: bytes = b"/lab/v1/chat/completions") -> ClientLine:
    """A request whose prompt is ``words`` words (about 5 bytes, 1.7 tokens each, first guessed)."""
    text = "word " * words
    body: dict[str, Any] = {"model": "m", "max_tokens": 16}
    if path.endswith(b"/responses"):
        body["input"] = text
    elif path.endswith(b"/completions") and b"chat" not in path:
        body["prompt"] = text
    else:
        body["messages"] = [{"role": "user", "content": text}]
    data = json.dumps(body).encode()
    client = proxy.client()
    head = b"POST %s HTTP/1.1\r\nHost: crossbar\r\nContent-Length: %d\r\n\r\n" % (path, len(data))
    client.send(head + data)
    return client


def json_answer(client: ClientLine) -> tuple[int, Any]:
    head, _, body = client.received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def windows(proxy: MemoryProxy, **window: int | None) -> None:
    for host, tokens in window.items():
        proxy.table.record_window(host.replace("_", "-"), "m", tokens)


def test_a_prompt_estimated_too_long_for_the_first_host_goes_to_the_one_it_fits(
    proxy: MemoryProxy,
) -> None:
    windows(proxy, gpu_a=2048, gpu_b=8192)
    ask(proxy, 10)  # short: the route's first host, as always
    host = proxy.accept()
    assert host.host == "gpu-a"
    host.send(answer())
    ask(proxy, 1500)  # ~2,500 tokens by the first guess (3 bytes a token)
    host = proxy.accept()
    assert host.host == "gpu-b"
    host.send(answer())
    record = proxy.records[-1]
    assert record.status == 200 and record.tried == ("gpu-b",)
    assert record.size_note is not None and record.size_note.endswith("too long for gpu-a")
    assert access_line(record).endswith(f"({record.size_note})")


def test_a_host_s_refusal_is_tried_on_the_host_that_fits_and_its_window_learned(
    proxy: MemoryProxy,
) -> None:
    windows(proxy, gpu_a=None, gpu_b=None)  # never read: both may fit
    client = ask(proxy, 1500)
    gpu_a = proxy.accept()
    assert gpu_a.host == "gpu-a"
    gpu_a.send(refusal(2600, 2048))
    assert client.received == b""  # nothing of the refusal reached the client
    gpu_b = proxy.accept()
    assert gpu_b.host == "gpu-b" and gpu_b.received.endswith(b"}")
    gpu_b.send(answer())
    status, _ = json_answer(client)
    assert status == 200 and b"x-crossbar-host: gpu-b" in client.received.lower()
    state = proxy.table.get("gpu-a")
    assert state is not None and state.window("m") == 2048
    record = proxy.records[-1]
    assert record.tried == ("gpu-a", "gpu-b")
    assert record.size_note == "moved: 2600 tokens > gpu-a's window 2048"
    line = json.loads(json_line({"access": record}) or "{}")
    tried = "tried gpu-a: refused the prompt as too long, gpu-b"
    assert line["note"] == f"{tried}; moved: 2600 tokens > gpu-a's window 2048"
    ask(proxy, 1500)  # learned: not sent to gpu-a again (gpu-b's connection is kept alive)
    gpu_b.send(answer())
    assert proxy.records[-1].tried == ("gpu-b",) and proxy.waiting == []


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (b"/lab/v1/messages", "prompt is too long: 9100 tokens > 8192 maximum"),
        (b"/lab/v1/chat/completions", "context_length_exceeded"),
        (b"/lab/v1/completions", "context_length_exceeded"),
        (b"/lab/v1/responses", "context_length_exceeded"),
    ],
)
def test_a_prompt_no_host_holds_is_answered_in_the_api_s_own_words(
    proxy: MemoryProxy, path: bytes, words: str
) -> None:
    windows(proxy, gpu_a=None, gpu_b=None)
    client = ask(proxy, 10, path)
    gpu_a = proxy.accept()
    gpu_a.send(refusal(9100, 4096))
    proxy.accept().send(refusal(9100, 8192))  # gpu-b: the largest window
    status, body = json_answer(client)
    assert status == 400
    if path.endswith(b"/messages"):
        assert body == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": words},
        }
    else:
        assert body["error"]["code"] == words and "9100" in body["error"]["message"]
        assert body["error"]["type"] == "invalid_request_error"
    record = proxy.records[-1]
    assert record.status == 400 and record.tried == ("gpu-a", "gpu-b")
    assert record.size_note == "too long for every host: 9100 tokens > gpu-b's window 8192"
    client = ask(proxy, 10, path)  # both windows known now: gpu-a's refusal is the last word
    gpu_a.send(refusal(9100, 4096))
    assert json_answer(client)[0] == 400 and proxy.waiting == []
    assert proxy.records[-1].tried == ("gpu-a",)


def test_another_400_is_relayed_as_the_host_sent_it(proxy: MemoryProxy) -> None:
    client = ask(proxy, 10)
    host = proxy.accept()
    body = b'{"error":{"code":400,"message":"bad grammar","type":"invalid_request_error"}}'
    host.send(answer(body, b"400 Bad Request"))
    status, error = json_answer(client)
    assert (status, error) == (400, json.loads(body))
    assert proxy.records[-1].size_note is None and proxy.waiting == []


def test_a_client_that_leaves_while_a_400_is_read_closes_the_host_connection(
    proxy: MemoryProxy,
) -> None:
    client = ask(proxy, 10)
    host: HostLine = proxy.accept()
    host.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 100\r\n\r\n{")
    client.leave()
    proxy.clock.advance(0)
    assert host.closed and proxy.records[-1].status == 499
    assert proxy.waiting == []


def test_a_400_whose_body_never_comes_is_a_504_at_the_head_s_deadline(proxy: MemoryProxy) -> None:
    client = ask(proxy, 10)
    host = proxy.accept()
    host.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 100\r\n\r\n{")
    proxy.clock.advance(61)
    status, error = json_answer(client)
    assert status == 504 and error["error"]["message"] == "upstream timeout (host gpu-a)"
    assert host.closed

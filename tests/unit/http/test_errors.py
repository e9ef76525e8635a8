"""crossbar.http.errors: crossbar's own errors in the shape the client's API reads, as a
rule and on the wire: each of 401, 404, 413, 502, 503 and 504 sent through crossbar's site
and exchange in memory (crossbar.testing.MemoryProxy), on Claude Code's, Codex's and the chat
completions' paths. What each agent then prints is in tests/system/test_agents.py (OpenCode's in
tests/system/test_opencode.py, the OpenAI Node SDK's in tests/system/test_clients.py); what
the OpenAI and Anthropic Python SDKs print is here, at the end."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from crossbar.config import parse_config
from crossbar.http.errors import error_payload, too_long_payload
from crossbar.http.keys import KeyGuard
from crossbar.testing import ClientLine, MemoryProxy
from tests.support.errors import api_error
from tests.support.memoryhttp import memory_http_client


def test_the_openai_apis_and_the_rest_get_llama_server_s_shape_with_the_words() -> None:
    """The OpenAI SDKs print ``error.message`` of this shape, and only the status of a
    plain string under ``error``."""
    assert error_payload(b"/v1/chat/completions", 502, "upstream failed", {"host": "gpu-a"}) == {
        "error": {"message": "upstream failed (host gpu-a)", "type": "server_error", "code": 502}
    }
    assert error_payload(b"/lab/v1/responses", 401, "unauthorized") == api_error(
        401, "unauthorized"
    )
    assert error_payload(b"/lab/props", 404, "not found")["error"] == {
        "message": "not found",
        "type": "not_found_error",
        "code": 404,
    }


def test_crossbar_s_own_pages_keep_the_plain_shape() -> None:
    assert error_payload(b"/_crossbar/status", 404, "not found") == {"error": "not found"}


def test_the_messages_api_gets_anthropic_s_shape_with_the_same_words() -> None:
    """Claude Code shows ``error.message`` of this shape, and raw JSON of any other."""
    found = error_payload(b"/v1/messages", 502, "upstream failed", {"host": "gpu-a"})
    assert found == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream failed (host gpu-a)"},
    }
    assert error_payload(b"/lab/v1/messages/count_tokens", 503, "no healthy host") == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "no healthy host"},
    }
    assert error_payload(b"/lab/v1/messages", 401, "unauthorized")["error"] == {
        "type": "authentication_error",
        "message": "unauthorized",
    }


# -- on the wire: each error crossbar makes, through its site and exchange -------------------

KEY = b"lab-key-of-twenty-four-b"
MESSAGES = b"/lab/v1/messages?beta=true"  # as Claude Code asks
COUNT_TOKENS = b"/lab/v1/messages/count_tokens?beta=true"
RESPONSES = b"/lab/v1/responses"  # as Codex asks
INPUT_TOKENS = b"/lab/v1/responses/input_tokens"
CHAT = b"/lab/v1/chat/completions"
BODY = b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'


def keyed_proxy() -> MemoryProxy:
    """Two hosts with model ``m``, a route wanting ``KEY``, bodies up to 1 KiB, and the
    guard a listener of this config has."""
    config = parse_config(
        {
            "hosts": {"gpu-a": "http://127.0.0.1:18081", "gpu-b": "http://127.0.0.1:18082"},
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "api_keys": [KEY.decode()]}},
            "header_timeout": 60,
            "max_body": "1KiB",
        }
    )
    proxy = MemoryProxy(config, models=("m",))
    proxy.site.guard = KeyGuard.for_config(config)
    return proxy


def send(proxy: MemoryProxy, path: bytes, key: bytes = KEY, body: bytes = BODY) -> ClientLine:
    client = proxy.client()
    head = b"POST %s HTTP/1.1\r\nHost: crossbar\r\nAuthorization: Bearer %s\r\n" % (path, key)
    client.send(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return client


def unauthorized(proxy: MemoryProxy, path: bytes) -> ClientLine:
    return send(proxy, path, key=b"wrong-key")


def unknown_route(proxy: MemoryProxy, path: bytes) -> ClientLine:
    return send(proxy, path.replace(b"/lab/", b"/nowhere/", 1))


def too_large(proxy: MemoryProxy, path: bytes) -> ClientLine:
    return send(proxy, path, body=BODY + b" " * 1024)


def upstream_failed(proxy: MemoryProxy, path: bytes) -> ClientLine:
    client = send(proxy, path)
    proxy.refuse()
    proxy.refuse()
    return client


def no_healthy_host(proxy: MemoryProxy, path: bytes) -> ClientLine:
    for host in ("gpu-a", "gpu-b"):
        proxy.table.mark_down(host, "gone")
    return send(proxy, path)


def upstream_timeout(proxy: MemoryProxy, path: bytes) -> ClientLine:
    client = send(proxy, path)
    proxy.accept()
    proxy.clock.advance(60)
    return client


CAUSES = {
    401: unauthorized,
    404: unknown_route,
    413: too_large,
    502: upstream_failed,
    503: no_healthy_host,
    504: upstream_timeout,
}
DOWN = (
    "no healthy host for route lab: gpu-a down (marked down: gone), gpu-b down (marked down: gone)"
)
"""The 503 when every host of the route is down: each named, with why."""
ANTHROPIC = {
    401: ("authentication_error", "unauthorized: key not known"),
    404: ("not_found_error", "unknown route"),
    413: ("request_too_large", "body too large"),
    502: ("api_error", "upstream failed (host gpu-b)"),
    503: ("overloaded_error", DOWN),
    504: ("api_error", "upstream timeout (host gpu-a)"),
}
OPENAI = {
    401: api_error(401, "unauthorized: key not known"),
    404: api_error(404, "unknown route"),
    413: api_error(413, "body too large"),
    502: api_error(502, "upstream failed (host gpu-b)"),
    503: api_error(503, DOWN),
    504: api_error(504, "upstream timeout (host gpu-a)"),
}


def answer(client: ClientLine) -> tuple[int, bytes, object]:
    """Status, ``Content-Type`` and JSON body of crossbar's answer."""
    head, _, body = client.received.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}
    return int(status_line.split()[1]), headers[b"content-type"], json.loads(body)


@pytest.mark.parametrize("path", [MESSAGES, COUNT_TOKENS])
@pytest.mark.parametrize("status", sorted(CAUSES))
def test_claude_code_gets_each_of_crossbar_s_errors_in_anthropic_s_shape(
    status: int, path: bytes
) -> None:
    """Claude Code prints ``API Error: <status> <error.message>`` of this shape (raw JSON
    of any other): the message is crossbar's words."""
    proxy = keyed_proxy()
    client = CAUSES[status](proxy, path)
    kind, words = ANTHROPIC[status]
    found = answer(client)
    assert found == (
        status,
        b"application/json",
        {"type": "error", "error": {"type": kind, "message": words}},
    )


@pytest.mark.parametrize("path", [RESPONSES, INPUT_TOKENS, CHAT])
@pytest.mark.parametrize("status", sorted(CAUSES))
def test_codex_and_the_openai_clients_get_each_of_crossbar_s_errors_in_llama_server_s_shape(
    status: int, path: bytes
) -> None:
    """Codex prints the body as it came, the OpenAI SDKs ``error.message``."""
    proxy = keyed_proxy()
    client = CAUSES[status](proxy, path)
    assert answer(client) == (status, b"application/json", OPENAI[status])


@pytest.mark.parametrize("path", [b"/v1/messages", b"/lab/v1/messages"])
def test_a_prompt_too_long_for_every_host_is_told_in_anthropic_s_words(path: bytes) -> None:
    """Claude Code reads ``prompt is too long: N tokens > M maximum`` and compacts."""
    assert too_long_payload(path, 10_000, 8192) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 10000 tokens > 8192 maximum",
        },
    }


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (b"/lab/v1/chat/completions", "maximum context length is 8192 tokens. However, your"
         " messages resulted in 10000 tokens"),
        (b"/lab/v1/completions", "maximum context length is 8192 tokens"),
        (b"/lab/v1/responses", "(10000 tokens > 8192 maximum)"),
    ],
)  # fmt: skip
def test_a_prompt_too_long_for_every_host_is_told_in_openai_s_words(
    path: bytes, words: str
) -> None:
    """Codex and the OpenAI SDKs act on the code ``context_length_exceeded``."""
    error = too_long_payload(path, 10_000, 8192)["error"]
    assert isinstance(error, dict)
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert words in error["message"]


# -- what the OpenAI Python SDK shows a person ------------------------------------------------


ALICE = "a" * 24


def sdk(proxy: MemoryProxy, key: str = ALICE, route: str = "lab") -> openai.OpenAI:
    """The OpenAI Python SDK, its requests sent to ``proxy`` in memory, its retries off."""
    return openai.OpenAI(
        base_url=f"http://crossbar.test/{route}/v1",
        api_key=key,
        max_retries=0,
        http_client=memory_http_client(proxy),
    )


def waiting_proxy() -> MemoryProxy:
    """Two hosts of one slot each, ``alice`` may have two requests waiting, bodies up to 1 KiB."""
    hosts = {f"gpu-{n}": {"url": f"http://127.0.0.1:1808{i}", "slots": 1}
             for i, n in enumerate("ab")}  # fmt: skip
    config = parse_config(
        {
            "hosts": hosts,
            "api_keys": [{"name": "alice", "key": ALICE, "max_waiting": 2}],
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m"}},
            "max_body": "1KiB",
        }
    )
    proxy = MemoryProxy(config, models=("m",))
    proxy.site.guard = KeyGuard.for_config(config)
    return proxy


def chat(client: openai.OpenAI, text: str = "hi") -> None:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])


def shown(
    client: Callable[..., Any], ask: Callable[..., object], down: Callable[[Any], object]
) -> dict[int, str]:
    """What a script's traceback shows of an SDK's error on each of crossbar's 401, 404,
    413, 429 and 503: ``ClassName: str(exc)``. ``client(proxy, key=..., route=...)`` makes
    the SDK's client, ``ask(client, text)`` sends it a request, ``down(client)`` the one
    asked once every host is down."""
    proxy = waiting_proxy()
    calls: list[tuple[int, Callable[[], object]]] = [
        (401, lambda: ask(client(proxy, key="wrong-key-of-twenty-four"))),
        (404, lambda: ask(client(proxy, route="nope"))),
        (413, lambda: ask(client(proxy), "x" * 2000)),
        (429, lambda: ask(client(proxy))),
        (503, lambda: down(client(proxy))),
    ]
    found = {}
    for status, act in calls:
        if status == 429:
            for _ in range(4):  # two hold the slots, two wait: alice's limit
                send(proxy, CHAT, key=ALICE.encode())
            proxy.accept(), proxy.accept()
        if status == 503:
            for host in ("gpu-a", "gpu-b"):
                proxy.table.mark_down(host, "gone")
        with pytest.raises(Exception) as raised:
            act()
        found[status] = f"{type(raised.value).__name__}: {raised.value}"
    return found


def test_the_openai_sdk_shows_crossbar_s_words() -> None:
    """The status and crossbar's words (a plain string under ``error`` came out as ``Error
    code: 404`` alone)."""
    found = shown(sdk, chat, lambda client: client.models.list())
    assert found == {
        401: "AuthenticationError: Error code: 401 - unauthorized: key not known",
        404: "NotFoundError: Error code: 404 - unknown route",
        413: "APIStatusError: Error code: 413 - body too large",
        429: found[429],
        503: f"InternalServerError: Error code: 503 - {DOWN}",
    }
    assert found[429].startswith("RateLimitError: Error code: 429 - alice: 2 requests already")


def claude_sdk(proxy: MemoryProxy, key: str = ALICE, route: str = "lab") -> anthropic.Anthropic:
    """The Anthropic Python SDK (its key sent as ``X-Api-Key``), its requests sent to
    ``proxy`` in memory, its retries off."""
    return anthropic.Anthropic(
        base_url=f"http://crossbar.test/{route}",
        api_key=key,
        max_retries=0,
        http_client=memory_http_client(proxy),
    )


def message(client: anthropic.Anthropic, text: str = "hi") -> None:
    client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": text}])


def test_the_anthropic_sdk_shows_crossbar_s_words() -> None:
    """The status, crossbar's words, and the path and type of Anthropic's shape."""
    assert shown(claude_sdk, message, message) == {
        401: "AuthenticationError: 401 unauthorized: key not known"
        " (path: /lab/v1/messages, type: authentication_error)",
        404: "NotFoundError: 404 unknown route (path: /nope/v1/messages, type: not_found_error)",
        413: "ContentTooLargeError: 413 body too large"
        " (path: /lab/v1/messages, type: request_too_large)",
        429: "RateLimitError: 429 alice: 2 requests already waiting"
        " (path: /lab/v1/messages, type: rate_limit_error)",
        503: f"ServiceUnavailableError: 503 {DOWN}"
        " (path: /lab/v1/messages, type: overloaded_error)",
    }

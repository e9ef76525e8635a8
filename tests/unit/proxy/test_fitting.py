"""crossbar.proxy.fitting: routing by fit as the exchange calls it, on a health table and a
learner of prompt sizes (no exchange, no sockets)."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock

from crossbar.config import Config, HostConfig, RouteConfig
from crossbar.polling.health import HealthTable
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.fitting import Fit
from crossbar.proxy.outcome import Outcome
from crossbar.routing import Conversation

M = "qwen3-coder-30b"
ROUTE = RouteConfig("lab", ("small", "big"), M)


def context() -> ProxyContext:
    config = Config(
        "tcp:0",
        hosts={n: HostConfig(n, f"http://{n}") for n in ("small", "big")},
        routes={"lab": ROUTE},
    )
    table = HealthTable(config.urls, Clock(), config.settings)
    for name in ("small", "big"):
        table.record_ok(name, [M], [M])
    table.record_window("small", M, 2048)
    table.record_window("big", M, 8192)
    none: Any = None
    return ProxyContext(config, table, none, none, Clock(), none)


def asked(
    text: str, api: str = "chat", limit: int | None = None, key: bytes | None = None
) -> Asked:
    body = json.dumps({"model": M, "messages": [{"role": "user", "content": text}]}).encode()
    conversation = None if key is None else Conversation(key, 0)
    return Asked(M, M, conversation, body, api=api, reply_limit=limit)


def fit(proxy: ProxyContext, request: Asked, path: bytes = b"/v1/chat/completions") -> Fit:
    outcome = Outcome(0.0)
    outcome.route, outcome.path = ROUTE, path
    return Fit(proxy, request, outcome)


def refusal(tokens: int, window: int) -> bytes:
    """llama-server's answer to a prompt longer than its slot."""
    error = {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": tokens,
             "n_ctx": window, "message": "request exceeds the available context size"}  # fmt: skip
    return json.dumps({"error": error}).encode()


def test_a_long_prompt_passes_over_the_small_host_once_its_rate_is_learned() -> None:
    proxy = context()
    short, long = asked("word " * 200, limit=100), asked("word " * 4000, limit=100)
    first = fit(proxy, long)
    assert first.estimate is not None and first.estimate.how == "first"
    assert first.small(ROUTE, []) == ["small"]
    assert first.small(ROUTE, ["small"]) == []
    assert fit(proxy, short).small(ROUTE, []) == []
    first.learn(4003)  # the host counted it: 5 bytes a token
    estimate = fit(proxy, long).estimate
    assert estimate is not None and estimate.how == "learned" and estimate.tokens == 4003


def test_what_is_not_a_prompt_is_not_sized() -> None:
    proxy = context()
    for request in (Asked(M, api="model", body=b"{}"), Asked(M, api="chat", body=None)):
        sized = fit(proxy, request)
        assert sized.estimate is None
        assert sized.small(ROUTE, []) == []
        assert not sized.holds(400, 300)


def test_a_refusal_teaches_the_window_and_the_size_and_says_whether_to_retry() -> None:
    proxy = context()
    proxy.table.record_window("small", M, None)  # not known yet: the refusal tells it
    request = asked("word " * 700, key=b"k")
    first = fit(proxy, request)
    assert first.holds(400, 300) and not first.holds(200, 300)
    assert first.refused("small", 400, refusal(3528, 2048), ["small"]) == (
        "3528 tokens > small's window 2048"
    )
    assert proxy.table.view["small"].window(M) == 2048
    estimate = fit(proxy, request).estimate
    assert estimate is not None and (estimate.tokens, estimate.how) == (3528, "conversation")
    assert first.refused("big", 400, b'{"error":{"code":400}}', ["small", "big"]) is None


def test_no_host_fits_is_answered_in_the_api_s_words_with_the_largest_window() -> None:
    proxy = context()
    too_long = refusal(10_000, 2048)
    status, body = fit(proxy, asked("x"), b"/v1/messages").refused("small", 400, too_long, [])  # type: ignore[misc]
    assert status == 400
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: 10000 tokens > 8192 maximum",
    }
    _, body = fit(proxy, asked("x")).refused("small", 400, too_long, [])  # type: ignore[misc]
    assert body["error"]["code"] == "context_length_exceeded"  # type: ignore[index]

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
from crossbar.proxy.fitting import (
    fits_elsewhere,
    hosts_too_small,
    learn_refusal,
    learn_usage,
    prompt_estimate,
    too_long_answer,
)
from crossbar.proxy.overflow import Overflow
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


def test_a_long_prompt_passes_over_the_small_host_once_its_rate_is_learned() -> None:
    proxy = context()
    short, long = asked("word " * 200, limit=100), asked("word " * 4000, limit=100)
    estimate = prompt_estimate(proxy, long)
    assert estimate is not None and estimate.how == "first"
    assert hosts_too_small(proxy, ROUTE, long, estimate) == ["small"]
    assert hosts_too_small(proxy, ROUTE, short, prompt_estimate(proxy, short)) == []
    learn_usage(proxy, long, 4003)  # the host counted it: 5 bytes a token
    estimate = prompt_estimate(proxy, long)
    assert estimate is not None and estimate.how == "learned" and estimate.tokens == 4003


def test_what_is_not_a_prompt_is_not_sized() -> None:
    proxy = context()
    assert prompt_estimate(proxy, Asked(M, api="model", body=b"{}")) is None
    assert prompt_estimate(proxy, Asked(M, api="chat", body=None)) is None
    assert hosts_too_small(proxy, ROUTE, Asked(M), None) == []


def test_a_refusal_teaches_the_window_and_the_size_and_says_whether_to_retry() -> None:
    proxy = context()
    proxy.table.record_window("small", M, None)  # not known yet: the refusal tells it
    request = asked("word " * 700, key=b"k")
    refusal = Overflow(prompt_tokens=3528, window=2048)
    learn_refusal(proxy, request, "small", refusal)
    assert proxy.table.view["small"].window(M) == 2048
    estimate = prompt_estimate(proxy, request)
    assert estimate is not None and (estimate.tokens, estimate.how) == (3528, "conversation")
    assert fits_elsewhere(proxy, ROUTE, request, refusal, tried=["small"])
    too_long = Overflow(prompt_tokens=10_000, window=8192)
    assert not fits_elsewhere(proxy, ROUTE, request, too_long, tried=["big"])


def test_no_host_fits_is_answered_in_the_api_s_words_with_the_largest_window() -> None:
    proxy = context()
    refusal = Overflow(prompt_tokens=10_000, window=2048)
    status, body = too_long_answer(proxy, ROUTE, asked("x"), b"/v1/messages", refusal)
    assert status == 400
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: 10000 tokens > 8192 maximum",
    }
    _, body = too_long_answer(proxy, ROUTE, asked("x"), b"/v1/chat/completions", refusal)
    assert body["error"]["code"] == "context_length_exceeded"  # type: ignore[index]

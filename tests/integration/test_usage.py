"""Exact: what a real llama-server router reported in its answers, across APIs (chat and
completions, Anthropic messages, Responses), streamed and not, summed by the test, is what
crossbar counts in ``crossbar_tokens_total``, writes in its JSON log lines and keeps in its
usage store (``GET /_crossbar/usage``), to the token.

Each prompt is sent twice, so that the second time the router reads part of it from its
prompt cache: the cached tokens are summed too, and must not be zero."""

from __future__ import annotations

import http.client
import json
import secrets
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import CrossbarStarter, RouterStarter
from tests.support.fleet import POLL, SEEN_TIMEOUT, crossbar_status, wait_until

pytestmark = pytest.mark.integration

KEY_VARIABLE = "CROSSBAR_TEST_ALICE_KEY"
STATUS_KEY = "status-key-of-the-test"
FLUSHED_TIMEOUT = 30.0
"""The store is written every 5 s; the log a batch every 0.1 s."""
PROMPT = "Tell me about the prompt cache of a llama-server, in a few words, please. " * 4
Reported = tuple[int, int, int]
"""``(prompt tokens, cached ones among them, generated tokens)`` as an answer said them."""


def post(url: str, path: str, body: dict[str, Any], key: str) -> bytes:
    target = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        conn.request("POST", path, json.dumps(body), headers)
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, (path, response.status, data[:500])
        return data
    finally:
        conn.close()


def get(url: str) -> bytes:
    target = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    try:
        path = target.path + ("?" + target.query if target.query else "")
        conn.request("GET", path, headers={"Authorization": f"Bearer {STATUS_KEY}"})
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, (url, response.status, data[:500])
        return data
    finally:
        conn.close()


def events(body: bytes) -> Iterator[tuple[str | None, Any]]:
    """``(event name, data)`` of each SSE event, ``[DONE]`` left out."""
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].strip())
        if data and data != ["[DONE]"]:
            yield name, json.loads("\n".join(data))


def from_chat(docs: list[dict[str, Any]]) -> Reported:
    """``usage`` (``prompt_tokens`` has the cached ones), else the last ``timings``."""
    usage = next((d["usage"] for d in reversed(docs) if d.get("usage")), None)
    timings = next((d["timings"] for d in reversed(docs) if d.get("timings")), {})
    if usage is None:
        return timings["prompt_n"] + timings["cache_n"], timings["cache_n"], timings["predicted_n"]
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", timings.get("cache_n"))
    return usage["prompt_tokens"], cached, usage["completion_tokens"]


def from_messages(start: dict[str, Any], end: dict[str, Any]) -> Reported:
    """``input_tokens`` leaves out the cached ones, ``cache_read_input_tokens``."""
    cached = start.get("cache_read_input_tokens", 0)
    return start["input_tokens"] + cached, cached, end["output_tokens"]


def from_responses(usage: dict[str, Any]) -> Reported:
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return usage["input_tokens"], cached, usage["output_tokens"]


def ask_every_api(url: str, key: str) -> list[Reported]:
    """Each API, streamed and not, each prompt twice; what each answer reported."""
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
    messages = {"model": "tiny-a", "max_tokens": 8, "messages": chat["messages"]}
    responses = {"model": "tiny-a", "input": PROMPT, "max_output_tokens": 8}
    found: list[Reported] = []
    for _ in range(2):
        body = post(url, "/lab/v1/chat/completions", chat, key)
        found.append(from_chat([json.loads(body)]))
        body = post(url, "/lab/v1/chat/completions", chat | {"stream": True}, key)
        found.append(from_chat([data for _, data in events(body)]))  # timings only
        streamed = chat | {"stream": True, "stream_options": {"include_usage": True}}
        body = post(url, "/lab/v1/chat/completions", streamed, key)
        found.append(from_chat([data for _, data in events(body)]))
        body = post(url, "/lab/v1/completions", {"prompt": PROMPT, "max_tokens": 8}, key)
        found.append(from_chat([json.loads(body)]))
        usage = json.loads(post(url, "/lab/v1/messages", messages, key))["usage"]
        found.append(from_messages(usage, usage))
        said = dict(events(post(url, "/lab/v1/messages", messages | {"stream": True}, key)))
        found.append(from_messages(said["message_start"]["message"]["usage"],
                                   said["message_delta"]["usage"]))  # fmt: skip
        usage = json.loads(post(url, "/lab/v1/responses", responses, key))["usage"]
        found.append(from_responses(usage))
        said = dict(events(post(url, "/lab/v1/responses", responses | {"stream": True}, key)))
        found.append(from_responses(said["response.completed"]["response"]["usage"]))
    return found


def counted(metrics: str) -> Reported:
    """alice's ``crossbar_tokens_total`` by kind."""
    kinds = {"prompt": 0.0, "cached": 0.0, "generated": 0.0}
    for line in metrics.splitlines():
        if line.startswith("crossbar_tokens_total{") and 'key="alice"' in line:
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('kind="', 1)[1].split('"', 1)[0]
            kinds[kind] += float(value)
    return int(kinds["prompt"]), int(kinds["cached"]), int(kinds["generated"])


def logged(output: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request" and line["key"] == "alice"]


def test_counters_log_lines_and_the_store_agree_exactly_with_what_the_answers_reported(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = "sk-" + secrets.token_urlsafe(24)
    monkeypatch.setenv(KEY_VARIABLE, key)
    router = llama_router(tiny_models("tiny-a"))
    proxy = crossbar_process(
        {
            "poll_interval": POLL,
            "log_format": "json",
            "hosts": {"gpu-a": router.url},
            "routes": {
                "lab": {
                    "hosts": ["gpu-a"],
                    "default_model": "tiny-a",
                    "api_keys": [{"name": "alice", "key": "${" + KEY_VARIABLE + "}"}],
                }
            },
            "status_keys": [STATUS_KEY],  # the pages want a key where routes have keys
        }
    )
    wait_until(
        lambda: crossbar_status(proxy, STATUS_KEY)["hosts"]["gpu-a"]["healthy"],
        SEEN_TIMEOUT,
        "gpu-a up",
    )
    answers = ask_every_api(proxy.url, key)
    expected = tuple(sum(column) for column in zip(*answers, strict=True))
    assert len(answers) == 16
    assert expected[1] > 0, answers  # the second of each pair read its prompt from the cache
    assert all(prompt > 0 and generated > 0 for prompt, _, generated in answers), answers

    assert counted(get(proxy.url + "/_crossbar/metrics").decode()) == expected

    lines = wait_until(
        lambda: (found := logged(proxy.output())) and len(found) >= 16 and found,
        FLUSHED_TIMEOUT,
        "crossbar logs 16 requests of alice's",
    )
    assert len(lines) == 16, lines
    in_log = [(n["prompt_tokens"], n["cached_tokens"], n["completion_tokens"]) for n in lines]
    assert sorted(in_log) == sorted(answers)  # each request's line says what its answer did

    def kept() -> dict[str, Any] | None:
        doc = json.loads(get(proxy.url + "/_crossbar/usage?by=key"))
        groups = {group["key"]: group for group in doc["groups"]}
        alice = groups.get("alice")
        return alice if alice is not None and alice["requests"] >= 16 else None

    alice = wait_until(kept, FLUSHED_TIMEOUT, "the usage store holds alice's 16 requests")
    assert alice["requests"] == 16
    kept_sums = (alice["prompt_tokens"], alice["cached_tokens"], alice["completion_tokens"])
    assert kept_sums == expected
    assert (Path(proxy.log_path).parent / "crossbar-usage.sqlite3").exists()  # beside the config

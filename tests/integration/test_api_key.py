"""crossbar in front of a real llama-server router started with ``--api-key``.

The router refuses ``/v1/models`` and completions without the key. crossbar has the key as
the host's ``api_key``, taken from an environment variable (``${...}``), so that the config
file holds no secret: the host is polled healthy, and a client that sends no key, or some
other key, gets its chat completion (the route itself has no ``api_keys``: it is open).
The same router configured without the key is down, and says why.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import CrossbarStarter, RouterStarter

pytestmark = pytest.mark.integration

KEY_VARIABLE = "CROSSBAR_TEST_GPU_A_KEY"
SEEN_TIMEOUT = 15.0


def call(
    url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def hosts_seen(proxy_url: str) -> dict[str, Any]:
    status, doc = call(f"{proxy_url}/_crossbar/status")
    assert status == 200, doc
    hosts: dict[str, Any] = doc["hosts"]
    return hosts


def test_a_host_with_an_api_key_is_polled_and_proxied_with_it(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = "sk-" + secrets.token_urlsafe(24)
    router = llama_router(tiny_models("tiny-a"), extra_args=("--api-key", key))
    # The router itself: the model list needs the key.
    assert call(f"{router.url}/v1/models")[0] == 401
    assert call(f"{router.url}/v1/models", headers={"Authorization": f"Bearer {key}"})[0] == 200

    monkeypatch.setenv(KEY_VARIABLE, key)  # crossbar's twistd inherits the environment
    proxy = crossbar_process(
        {
            "poll_interval": "250ms",
            "hosts": {
                "gpu-a": {"url": router.url, "api_key": f"${{{KEY_VARIABLE}}}"},
                "gpu-a-keyless": router.url,
            },
            "routes": {
                "lab": {"hosts": ["gpu-a"], "default_model": "tiny-a"},
                "keyless": {"hosts": ["gpu-a-keyless"], "default_model": "tiny-a"},
            },
        }
    )

    deadline = time.monotonic() + SEEN_TIMEOUT
    while True:
        hosts = hosts_seen(proxy.url)
        if hosts["gpu-a"]["healthy"] and hosts["gpu-a-keyless"]["last_err"]:
            break
        assert time.monotonic() < deadline, f"crossbar's view: {hosts}\n{proxy.log()}"
        time.sleep(0.1)
    assert hosts["gpu-a"]["known"] == ["tiny-a"]
    assert not hosts["gpu-a-keyless"]["healthy"]
    assert hosts["gpu-a-keyless"]["last_err"] == (
        "model list refused: 401 unauthorized — the host needs an api_key"
    )

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1}
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        status, answer = call(f"{proxy.url}/lab/v1/chat/completions", chat, headers)
        assert status == 200, (headers, answer, proxy.log())
        assert answer["object"] == "chat.completion"
        assert answer["model"] == "tiny-a"

    assert key not in proxy.output()
    assert key not in json.dumps(hosts_seen(proxy.url))

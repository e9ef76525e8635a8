"""A real llama-server router killed (``kill -9``) while it reads a long prompt: crossbar had
its head, nothing of its content reached the client, and the stream completes from the other
router, on chat, Messages and Responses.

Each test starts two routers serving the tiny model ``tiny-a`` with one slot and small
batches (``-b 4 -ub 4 -t 1``), so that a prompt of about 1,800 tokens takes about a second to
read on this kind of machine; host ``a`` is killed as soon as its log says its slot took the
request: it has sent its head and is reading the prompt. The access line's
``broke before any content`` shows it died after its head, before its first content."""

from __future__ import annotations

import os
import random
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.integration.conftest import CrossbarStarter, RouterStarter
from tests.support import fleet
from tests.support.fleet import SEEN_TIMEOUT, wait_until

pytestmark = pytest.mark.integration

MODEL = "tiny-a"
ENDS = {
    "/v1/chat/completions": b"data: [DONE]",
    "/v1/messages": b"event: message_stop",
    "/v1/responses": b"event: response.completed",
}
SLOW = ("-c", "2048", "-np", "1", "-b", "4", "-ub", "4", "-t", "1")


def long_prompt() -> str:
    """About 1,800 tokens of the tiny models' tokenizer, new each time (nothing cached)."""
    words = ("alpha", "beta", "gamma", "delta", "omega", "zeta")
    return " ".join(f"{random.choice(words)}{random.randint(0, 99)}" for _ in range(240))


def body_for(path: str) -> dict[str, Any]:
    text = long_prompt()
    if path == "/v1/responses":
        shaped: dict[str, Any] = {"input": text, "max_output_tokens": 4}
    else:
        shaped = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return {"model": MODEL, "stream": True, "temperature": 0, **shaped}


@pytest.mark.parametrize("path", list(ENDS))
def test_a_router_killed_mid_prefill_is_replaced_and_the_stream_completes(
    tiny_models: Any,
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    path: str,
) -> None:
    routers = {n: llama_router(tiny_models(MODEL), models_max=1, extra_args=SLOW) for n in "ab"}
    for router in routers.values():
        loaded = fleet.request("POST", f"{router.url}/models/load", {"model": MODEL})
        assert loaded.status == 200, loaded
        wait_until(lambda r=router: fleet.statuses_of(r)[MODEL] == "loaded", SEEN_TIMEOUT, "loaded")
    proxy = crossbar_process(
        {
            "poll_interval": fleet.POLL,
            "hosts": {name: r.url for name, r in routers.items()},
            "routes": {"lab": {"hosts": ["a", "b"], "policy": "priority", "default_model": MODEL}},
        }
    )

    def both_up() -> bool:
        hosts = fleet.crossbar_status(proxy)["hosts"]
        return all(MODEL in hosts[h].get("models", {}) for h in "ab")

    wait_until(both_up, SEEN_TIMEOUT, "crossbar sees tiny-a on both routers")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(fleet.stream_raw, f"{proxy.url}/lab{path}", body_for(path))
        wait_until(
            lambda: "processing task" in routers["a"].output(),
            SEEN_TIMEOUT,
            "router a's slot took the request (its head is sent; the prompt is being read)",
        )
        os.killpg(routers["a"].proc.pid, signal.SIGKILL)  # the router and its model server
        status, headers, raw = answer.result(timeout=60)
    assert status == 200, raw[-300:]
    assert headers.get("x-crossbar-host") == "b"
    assert ENDS[path] in raw, raw[-300:]
    log = wait_until(
        lambda: "(tried a: broke before any content" in proxy.output() and proxy.output(),
        5,
        "the access line names a and why",
    )
    assert f"lab b POST {path} 200" in log

"""``policy: cache_affinity`` on two real llama-server routers: a conversation's second turn is
sent to the host that served its first, so that host's prompt cache already holds everything
the first turn sent (``timings.cache_n``), and a third turn sent through another crossbar
process with the same config goes there too.

Both routers have the model loaded before crossbar starts, so both are in the route's best
group and only the policy decides where a turn goes (a model loaded on one host only would
send every turn there whatever the policy).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import CrossbarProcess, CrossbarStarter, RouterStarter
from tests.support.fleet import (
    SEEN_TIMEOUT,
    Answer,
    crossbar_status,
    request,
    statuses_of,
    wait_until,
)

pytestmark = pytest.mark.integration

MODEL = "tiny-a"
HOSTS = ("gpu-a", "gpu-b")
CONVERSATIONS = 6
SYSTEM = "You are a careful coding agent. " + "Read the files, then answer. " * 12


def chat(proxy: CrossbarProcess, messages: list[dict[str, str]]) -> Answer:
    body = {"messages": messages, "max_tokens": 16, "temperature": 0.8, "seed": 7}
    answer = request("POST", f"{proxy.url}/lab/v1/chat/completions", body)
    assert answer.status == 200, f"{answer.status}: {answer.body[:300]!r}"
    return answer


def prompt_tokens(answer: Answer) -> int:
    timings: dict[str, Any] = answer.json()["timings"]
    return int(timings["prompt_n"]) + int(timings["cache_n"])


def test_later_turns_go_where_the_conversation_is_cached_through_either_replica(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
) -> None:
    routers = [llama_router(tiny_models(MODEL), extra_args=("-np", "2")) for _ in HOSTS]
    for router in routers:
        loaded = request("POST", f"{router.url}/models/load", {"model": MODEL})
        assert loaded.status == 200, loaded
        wait_until(
            lambda r=router: statuses_of(r)[MODEL] == "loaded",
            SEEN_TIMEOUT,
            f"{router.url} has {MODEL} loaded",
        )
    config = {
        "poll_interval": "250ms",
        "hosts": {name: {"url": r.url, "slots": 2} for name, r in zip(HOSTS, routers, strict=True)},
        "routes": {
            "lab": {"hosts": list(HOSTS), "default_model": MODEL, "policy": "cache_affinity"}
        },
    }
    replicas = [crossbar_process(config), crossbar_process(config)]
    for proxy in replicas:
        wait_until(
            lambda p=proxy: all(MODEL in crossbar_status(p)["hosts"][h]["loaded"] for h in HOSTS),
            SEEN_TIMEOUT,
            f"crossbar on port {proxy.port} sees {MODEL} loaded on both hosts",
        )

    homes: dict[str, int] = {}
    for n in range(CONVERSATIONS):
        # Two turns through one replica, the third through the other.
        proxies = [replicas[n % 2], replicas[n % 2], replicas[(n + 1) % 2]]
        messages = [{"role": "system", "content": SYSTEM}]
        previous: Answer | None = None
        for turn, proxy in enumerate(proxies, 1):
            messages.append({"role": "user", "content": f"Conversation {n}, question {turn}?"})
            answer = chat(proxy, messages)
            messages.append(
                {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
            )
            if previous is None:
                assert answer.host in HOSTS, answer.headers
                homes[answer.host] = homes.get(answer.host, 0) + 1
            else:
                assert answer.host == previous.host, (
                    f"conversation {n}: turn {turn} went to {answer.host}, "
                    f"the turn before to {previous.host}"
                )
                reused = answer.json()["timings"]["cache_n"]
                assert reused >= prompt_tokens(previous), (
                    f"conversation {n}: turn {turn} reused {reused} tokens of the "
                    f"{prompt_tokens(previous)} the turn before sent"
                )
            previous = answer

    assert sorted(homes) == sorted(HOSTS), f"conversations per host: {homes}"

"""crossbar in front of two real llama-server routers with different model folders.

Most tests share one fleet (module scope): router ``gpu-a`` and router ``gpu-b``, each with a
models folder of its own, and crossbar polling them every 250 ms with one route ``lab`` whose
hosts are ``[gpu-a, gpu-b]`` and whose default model is ``tiny-a``. Each test works with models
that no other test names, so the tests do not depend on each other's order, and it checks the
state it starts from. The fleet remembers every model a request named; the last test waits
until the fleet has been polled for a whole minute and then checks that every other model is
still ``unloaded`` on its router: polling never makes a router load a model.

The failover test changes its routers (stops one, starts it again), so it has a fleet of its own.
It runs while the shared fleet keeps being polled, which is part of that minute.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest

from tests.integration.conftest import (
    CrossbarProcess,
    CrossbarStarter,
    RouterProcess,
    RouterStarter,
)
from tests.support.fleet import (
    POLL,
    REQUEST_TIMEOUT,
    SEEN_TIMEOUT,
    Answer,
    crossbar_status,
    models_of,
    request,
    statuses_of,
    stream_raw,
    wait_until,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")

POLL_SECONDS = 0.25
QUIET_MINUTE = 60.0
LOG_TIMEOUT = 5.0
"""Seconds for a line to reach crossbar's log, which writes a batch at a time (0.1 s)."""
ROUTER_BACK_TIMEOUT = 30.0
ROUTE = "lab"

# What each router of the shared fleet has in its models folder. Who names what:
#   tiny-a   the route's default model: default-model, streaming and openai tests
#   seen     loaded and unloaded on gpu-b behind crossbar's back: polling follows
#   shared   loaded on gpu-b only: a request for it goes to gpu-b
#   only-b   known to gpu-b only, loaded nowhere: goes to gpu-b, which loads it
#   cold     known to both, loaded nowhere: goes to gpu-a (route order), which loads it
#   swap     loaded on both, then unloaded one by one: the unload test
#   idle*    never named by anything: must stay unloaded after a minute of polling
A_MODELS = ("tiny-a", "shared", "cold", "swap", "idle", "idle-a")
B_MODELS = ("seen", "shared", "only-b", "cold", "swap", "idle", "idle-b")
IDLE = {"idle", "idle-a", "idle-b"}

CHAT = [{"role": "user", "content": "Hello crossbar"}]
# With a fixed seed the tiny models give the same tokens every time; prompt caching is turned off
# so that every request computes the prompt the same way.
SAMPLING = {"temperature": 0.8, "seed": 1, "cache_prompt": False}


# --------------------------------------------------------------------------------------------
# Plain HTTP helpers (the test process talks to separate processes: no reactor needed)
# --------------------------------------------------------------------------------------------


def sse_payloads(body: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded except ``[DONE]``."""
    payloads: list[Any] = []
    for event in body.decode().split("\n\n"):
        data = [line[len("data: ") :] for line in event.split("\n") if line.startswith("data: ")]
        if data:
            text = "\n".join(data)
            payloads.append(text if text == "[DONE]" else json.loads(text))
    return payloads


# Per request, these differ even when the generated text is the same.
VARYING = ("id", "created", "timings", "system_fingerprint")


def comparable(payloads: list[Any]) -> list[Any]:
    return [
        p if isinstance(p, str) else {k: v for k, v in p.items() if k not in VARYING}
        for p in payloads
    ]


# --------------------------------------------------------------------------------------------
# The shared fleet
# --------------------------------------------------------------------------------------------


@dataclass
class Fleet:
    a: RouterProcess
    b: RouterProcess
    proxy: CrossbarProcess
    started: float
    named: set[str] = field(default_factory=set)

    @property
    def routers(self) -> dict[str, RouterProcess]:
        return {"gpu-a": self.a, "gpu-b": self.b}

    def chat(self, model: str | None, **extra: Any) -> Answer:
        """A chat completion through crossbar's route (``model=None``: no "model" at all)."""
        body: dict[str, Any] = {"messages": CHAT, "max_tokens": 4, **SAMPLING, **extra}
        if model is not None:
            self.named.add(model)
            body["model"] = model
        return request("POST", f"{self.proxy.url}/{ROUTE}/v1/chat/completions", body)

    def load(self, router: RouterProcess, model: str) -> None:
        """Load ``model`` on ``router`` directly (not through crossbar), and wait for it."""
        self.named.add(model)
        answer = request("POST", f"{router.url}/models/load", {"model": model})
        assert (answer.status, answer.json()) == (200, {"success": True}), answer
        wait_until(
            lambda: statuses_of(router)[model] == "loaded",
            SEEN_TIMEOUT,
            f"{router.url} has {model} loaded",
        )

    def unload(self, router: RouterProcess, model: str) -> None:
        """Unload ``model`` on ``router`` directly, and wait until the router says so."""
        answer = request("POST", f"{router.url}/models/unload", {"model": model})
        assert (answer.status, answer.json()) == (200, {"success": True}), answer
        wait_until(
            lambda: statuses_of(router)[model] == "unloaded",
            SEEN_TIMEOUT,
            f"{router.url} has {model} unloaded",
        )

    def wait_seen(self, host: str, model: str, *, loaded: bool) -> None:
        """Wait until crossbar's status shows ``model`` loaded (or not) on ``host``."""

        def seen() -> bool:
            return (model in crossbar_status(self.proxy)["hosts"][host]["loaded"]) == loaded

        state = "loaded" if loaded else "not loaded"
        wait_until(seen, SEEN_TIMEOUT, f"crossbar's status shows {model} {state} on {host}")

    def truth(self) -> dict[str, tuple[list[str], list[str]]]:
        """What each router itself says: host -> (loaded models, known models), sorted."""
        found = {}
        for host, router in self.routers.items():
            statuses = statuses_of(router)
            loaded = sorted(m for m, s in statuses.items() if s == "loaded")
            found[host] = (loaded, sorted(statuses))
        return found

    def seen_by_crossbar(self) -> dict[str, tuple[list[str], list[str]]]:
        hosts = crossbar_status(self.proxy)["hosts"]
        return {
            host: (sorted(hosts[host]["loaded"]), sorted(hosts[host]["known"]))
            for host in self.routers
        }


def fleet_config(a: RouterProcess, b: RouterProcess, default_model: str) -> dict[str, Any]:
    return {
        "poll_interval": POLL,
        "hosts": {"gpu-a": a.url, "gpu-b": b.url},
        "routes": {ROUTE: {"hosts": ["gpu-a", "gpu-b"], "default_model": default_model}},
    }


def wait_all_healthy(proxy: CrossbarProcess, *hosts: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        status = crossbar_status(proxy)
        return status if all(status["hosts"][h]["healthy"] for h in hosts) else None

    return wait_until(ready, SEEN_TIMEOUT, f"crossbar sees {', '.join(hosts)} healthy")


@pytest.fixture(scope="module")
def fleet(
    tiny_models: Callable[..., Path],
    module_llama_router: RouterStarter,
    module_crossbar_process: CrossbarStarter,
) -> Iterator[Fleet]:
    a = module_llama_router(tiny_models(*A_MODELS), models_max=4)
    b = module_llama_router(tiny_models(*B_MODELS), models_max=4)
    proxy = module_crossbar_process(fleet_config(a, b, "tiny-a"))
    started = time.monotonic()
    wait_all_healthy(proxy, "gpu-a", "gpu-b")
    yield Fleet(a, b, proxy, started)


# --------------------------------------------------------------------------------------------
# Tests on the shared fleet
# --------------------------------------------------------------------------------------------


def test_polling_sees_exactly_which_models_each_router_has_resident(fleet: Fleet) -> None:
    wait_until(
        lambda: fleet.seen_by_crossbar() == fleet.truth(),
        SEEN_TIMEOUT,
        "crossbar's status matches the routers' /v1/models",
    )
    seen = fleet.seen_by_crossbar()
    assert seen["gpu-a"][1] == sorted(A_MODELS) and seen["gpu-b"][1] == sorted(B_MODELS)
    assert "seen" not in seen["gpu-b"][0]

    # A router loads a model behind crossbar's back: the next polls show it, on that host only.
    fleet.load(fleet.b, "seen")
    fleet.wait_seen("gpu-b", "seen", loaded=True)
    seen = fleet.seen_by_crossbar()
    assert seen == fleet.truth(), "crossbar's status differs from the routers' /v1/models"
    assert "seen" in seen["gpu-b"][0] and "seen" not in seen["gpu-a"][1]

    # ... and unloads it again: the polls show that too.
    fleet.unload(fleet.b, "seen")
    fleet.wait_seen("gpu-b", "seen", loaded=False)
    assert fleet.seen_by_crossbar() == fleet.truth()
    assert statuses_of(fleet.b)["seen"] == "unloaded"


def test_model_resident_only_on_the_second_router_goes_there(fleet: Fleet) -> None:
    assert statuses_of(fleet.a)["shared"] == "unloaded"
    assert statuses_of(fleet.b)["shared"] == "unloaded"
    fleet.load(fleet.b, "shared")
    fleet.wait_seen("gpu-b", "shared", loaded=True)

    answer = fleet.chat("shared")

    assert answer.status == 200, answer
    assert answer.host == "gpu-b", "gpu-a is first in the route, but only gpu-b has it loaded"
    assert answer.json()["model"] == "shared"
    assert statuses_of(fleet.a)["shared"] == "unloaded", "gpu-a must not have loaded it"
    line = f"{ROUTE} gpu-b POST /v1/chat/completions 200"
    assert fleet.proxy.wait(lambda: line in fleet.proxy.log_text(), LOG_TIMEOUT), line


def test_model_resident_nowhere_goes_to_a_router_that_knows_it_which_loads_it(
    fleet: Fleet,
) -> None:
    # Known to gpu-b only (gpu-a, first in the route, does not know it).
    assert "only-b" not in statuses_of(fleet.a)
    assert statuses_of(fleet.b)["only-b"] == "unloaded"
    answer = fleet.chat("only-b")
    assert (answer.status, answer.host) == (200, "gpu-b"), answer
    assert answer.json()["model"] == "only-b"
    assert statuses_of(fleet.b)["only-b"] == "loaded", "gpu-b should have loaded it"
    fleet.wait_seen("gpu-b", "only-b", loaded=True)

    # Known to both, loaded on neither: the first in the route's order that knows it.
    assert statuses_of(fleet.a)["cold"] == statuses_of(fleet.b)["cold"] == "unloaded"
    answer = fleet.chat("cold")
    assert (answer.status, answer.host) == (200, "gpu-a"), answer
    assert answer.json()["model"] == "cold"
    assert statuses_of(fleet.a)["cold"] == "loaded", "gpu-a should have loaded it"
    assert statuses_of(fleet.b)["cold"] == "unloaded", "gpu-b must not have loaded it"


def test_request_naming_no_model_is_served_with_the_routes_default(fleet: Fleet) -> None:
    fleet.named.add("tiny-a")
    direct = request("POST", f"{fleet.a.url}/v1/chat/completions", {"messages": CHAT})
    assert direct.status == 400, "the router itself refuses a request without a model"
    assert direct.json()["error"]["message"] == "model name is missing from the request"

    answer = fleet.chat(None)

    assert (answer.status, answer.host) == (200, "gpu-a"), answer
    body = answer.json()
    assert body["model"] == "tiny-a"
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] == 4


def test_streaming_through_crossbar_gives_the_same_events_as_direct(fleet: Fleet) -> None:
    fleet.named.add("tiny-a")
    body = {"model": "tiny-a", "messages": CHAT, "max_tokens": 32, "stream": True, **SAMPLING}

    status, headers, through = stream_raw(f"{fleet.proxy.url}/{ROUTE}/v1/chat/completions", body)
    assert (status, headers.get("x-crossbar-host")) == (200, "gpu-a"), through[:500]
    assert headers["content-type"] == "text/event-stream"
    d_status, d_headers, direct = stream_raw(f"{fleet.a.url}/v1/chat/completions", body)
    assert d_status == 200 and d_headers["content-type"] == "text/event-stream"

    via, straight = sse_payloads(through), sse_payloads(direct)
    assert via[-1] == straight[-1] == "[DONE]"
    assert len(via) == 1 + 32 + 1 + 1, "role, one event per token, finish, [DONE]"
    assert via[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert via[-2]["choices"][0]["finish_reason"] == "length"
    assert "timings" in via[-2]
    assert comparable(via) == comparable(straight)
    assert len({p["id"] for p in via[:-1]}) == 1, "one id for every event of a stream"
    # The text is not empty: the comparison above compared real tokens.
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in via[1:-2]).strip()


def test_official_openai_client_works_through_crossbar(fleet: Fleet) -> None:
    fleet.named.add("tiny-a")
    client = openai.OpenAI(
        base_url=f"{fleet.proxy.url}/{ROUTE}/v1",
        api_key="sk-unused",
        max_retries=0,
        timeout=REQUEST_TIMEOUT,
    )
    extra = {"seed": 1, "cache_prompt": False}
    with client:
        # No model in a GET: the first healthy host of the route answers with its own list.
        assert sorted(m.id for m in client.models.list()) == sorted(A_MODELS)

        raw = client.chat.completions.with_raw_response.create(
            model="tiny-a", messages=CHAT, max_tokens=8, temperature=0.8, extra_body=extra
        )
        assert raw.headers["x-crossbar-host"] == "gpu-a"
        completion = raw.parse()
        assert completion.model == "tiny-a" and completion.object == "chat.completion"
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None and completion.usage.completion_tokens == 8
        whole = completion.choices[0].message.content
        assert whole

        stream = client.chat.completions.create(
            model="tiny-a",
            messages=CHAT,
            max_tokens=8,
            temperature=0.8,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        chunks = list(stream)
        pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        assert "".join(pieces) == whole, "same seed, same text, streamed or not"
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 8

        text = client.completions.create(
            model="tiny-a", prompt="Hello", max_tokens=4, temperature=0.8, extra_body=extra
        )
        assert text.model == "tiny-a" and text.choices[0].finish_reason == "length"


def test_unloading_a_model_moves_the_next_request_per_the_choice_rule(fleet: Fleet) -> None:
    fleet.load(fleet.a, "swap")
    fleet.load(fleet.b, "swap")
    fleet.wait_seen("gpu-a", "swap", loaded=True)
    fleet.wait_seen("gpu-b", "swap", loaded=True)
    # Loaded on both: the first in the route's order.
    answer = fleet.chat("swap")
    assert (answer.status, answer.host) == (200, "gpu-a"), answer

    # Unloaded on gpu-a: the one that still has it loaded, and gpu-a does not load it again.
    fleet.unload(fleet.a, "swap")
    fleet.wait_seen("gpu-a", "swap", loaded=False)
    answer = fleet.chat("swap")
    assert (answer.status, answer.host) == (200, "gpu-b"), answer
    assert statuses_of(fleet.a)["swap"] == "unloaded"

    # Unloaded on both: the first that knows it, which loads it.
    fleet.unload(fleet.b, "swap")
    fleet.wait_seen("gpu-b", "swap", loaded=False)
    answer = fleet.chat("swap")
    assert (answer.status, answer.host) == (200, "gpu-a"), answer
    assert statuses_of(fleet.a)["swap"] == "loaded"
    assert statuses_of(fleet.b)["swap"] == "unloaded"


# --------------------------------------------------------------------------------------------
# A router stops mid-test (a fleet of its own)
# --------------------------------------------------------------------------------------------


def test_stopped_router_moves_traffic_and_comes_back_after_two_good_polls(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
) -> None:
    a = llama_router(tiny_models("tiny-a", "only-a"))
    b = llama_router(tiny_models("tiny-a"))
    # The route's default model is known to gpu-a only, so the status page's "choice" for the
    # route says gpu-a whenever crossbar trusts gpu-a, and gpu-b otherwise.
    proxy = crossbar_process(fleet_config(a, b, "only-a"))
    wait_all_healthy(proxy, "gpu-a", "gpu-b")
    url = f"{proxy.url}/{ROUTE}/v1/chat/completions"

    def chat(model: str) -> Answer:
        return request("POST", url, {"model": model, "messages": CHAT, "max_tokens": 2})

    answer = chat("tiny-a")
    assert (answer.status, answer.host) == (200, "gpu-a"), answer

    # Stop gpu-a and ask at once, before a poll can have noticed: the request goes to gpu-b.
    a.stop()
    answer = chat("tiny-a")
    assert (answer.status, answer.host) == (200, "gpu-b"), answer

    def down() -> dict[str, Any] | None:
        host = crossbar_status(proxy)["hosts"]["gpu-a"]
        return host if not host["healthy"] and host["state"] == "down" else None

    host = wait_until(down, SEEN_TIMEOUT, "crossbar's status shows gpu-a down")
    assert host["last_err"], host
    assert proxy.wait(lambda: "host gpu-a is down" in proxy.log_text(), LOG_TIMEOUT)
    # Everything goes to gpu-b now, even a model only gpu-a knows (gpu-b refuses it).
    answer = chat("tiny-a")
    assert (answer.status, answer.host) == (200, "gpu-b"), answer
    answer = chat("only-a")
    assert (answer.status, answer.host) == (400, "gpu-b"), answer
    assert answer.json()["error"]["message"] == "model 'only-a' not found"

    # Watch gpu-a's entry in crossbar's status while a new router comes up on the same port.
    seen: list[tuple[int, bool, str | None]] = []
    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + ROUTER_BACK_TIMEOUT
        while not done.is_set() and time.monotonic() < deadline:
            status = crossbar_status(proxy)
            gpu_a = status["hosts"]["gpu-a"]
            seen.append((gpu_a["consecutive"], gpu_a["healthy"], status["routes"][ROUTE]["choice"]))
            if gpu_a["healthy"]:
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        a2 = llama_router.restart(a)
        watcher.join(ROUTER_BACK_TIMEOUT + 5)
    finally:
        done.set()
    assert a2.port == a.port and a2.url == a.url

    assert seen and seen[-1][1], f"gpu-a never became healthy again: {seen[-5:]}"
    history = _squash(seen)
    first_healthy = next(i for i, (_, healthy, _) in enumerate(history) if healthy)
    assert history[first_healthy][0] == 2, f"healthy again after 2 good polls, not: {history}"
    assert (1, False, "gpu-b") in history, f"one good poll is not enough: {history}"
    assert all(choice == "gpu-b" for _, healthy, choice in history if not healthy), history
    assert history[first_healthy][2] == "gpu-a", history

    def back_up() -> bool:
        return "host gpu-a is up" in proxy.log_text().split("host gpu-a is down")[-1]

    assert proxy.wait(back_up, LOG_TIMEOUT)

    # Traffic comes back: a model only gpu-a knows is served there again; a model still loaded
    # on gpu-b (and not on the restarted gpu-a) stays there, per the choice rule.
    answer = chat("only-a")
    assert (answer.status, answer.host) == (200, "gpu-a"), answer
    answer = chat("tiny-a")
    assert (answer.status, answer.host) == (200, "gpu-b"), answer


def _squash(seen: list[T]) -> list[T]:
    """Drop repeats in a row: the distinct states, in the order they were seen."""
    return [item for i, item in enumerate(seen) if i == 0 or item != seen[i - 1]]


# --------------------------------------------------------------------------------------------
# Last: a minute of polling the shared fleet
# --------------------------------------------------------------------------------------------


def test_a_minute_of_polling_makes_no_router_load_a_model(fleet: Fleet) -> None:
    """Every model no request named is still ``unloaded`` after a minute of 250 ms polls."""

    def idle_still_unloaded() -> None:
        for host, router in fleet.routers.items():
            for model, status in models_of(router).items():
                if model in IDLE:
                    assert status["value"] == "unloaded", (host, model, status)

    # Checked once a second, so a load caused by polling fails the test when it happens.
    while time.monotonic() - fleet.started < QUIET_MINUTE:
        idle_still_unloaded()
        time.sleep(min(1.0, max(0.0, QUIET_MINUTE - (time.monotonic() - fleet.started))))
    polled_for = time.monotonic() - fleet.started
    assert polled_for >= QUIET_MINUTE

    status = crossbar_status(fleet.proxy)
    for host, router in fleet.routers.items():
        entry = status["hosts"][host]
        assert entry["healthy"] and entry["state"] == "up", entry
        # About 240 polls in a minute; allow for a slow machine, but it must have kept polling.
        assert entry["consecutive"] >= QUIET_MINUTE / POLL_SECONDS / 2, entry

        models = models_of(router)
        untouched = {m: s for m, s in models.items() if m not in fleet.named}
        assert IDLE & set(models) <= set(untouched), "an idle model was named by a request"
        for model, state in untouched.items():
            assert state["value"] == "unloaded", f"{host} loaded {model}, no request named it"
            assert "failed" not in state, (host, model, state)
        spawned = set(re.findall(r"spawning server instance with name=(\S+)", _log(router)))
        assert not spawned & set(untouched), f"{host} started instances of {spawned}"

    assert wait_until(
        lambda: fleet.seen_by_crossbar() == fleet.truth(),
        SEEN_TIMEOUT,
        "crossbar's status matches the routers' /v1/models",
    )

    # Nothing was proxied for a minute, far longer than the routers keep an idle connection
    # (5 s): a request now still goes through, on a fresh connection.
    answer = fleet.chat("tiny-a")
    assert (answer.status, answer.host) == (200, "gpu-a"), answer


def _log(router: RouterProcess) -> str:
    return router.log_path.read_text(errors="replace")

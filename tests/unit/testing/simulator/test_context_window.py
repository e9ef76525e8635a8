"""The simulator's slot windows: told as llama-server tells them (``/props``, ``meta``), and
a prompt too long refused byte for byte as llama.cpp 0c1e57098 refuses it, on every API."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from treq.testing import StubTreq

from crossbar.demo import WINDOWS
from crossbar.testing import SimulatedHost
from crossbar.testing.simulator.__main__ import main as simulator_main

LONG = "word " * 3000
"""About 3,000 of the simulator's tokens of user text."""

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": LONG}]},
    "/v1/completions": {"prompt": LONG},
    "/v1/messages": {"max_tokens": 64, "messages": [{"role": "user", "content": LONG}]},
    "/v1/responses": {"input": LONG},
}
COUNTS = {
    "/v1/chat/completions": "/v1/chat/completions/input_tokens",
    "/v1/messages": "/v1/messages/count_tokens",
    "/v1/responses": "/v1/responses/input_tokens",
}


async def post(sim: SimulatedHost, path: str, body: dict[str, Any]) -> tuple[int, bytes, Any]:
    stub = StubTreq(sim.resource)
    response = await stub.post("http://sim" + path, json={"model": "tiny-a", **body})
    return response.code, await stub.content(response), response.headers


async def prompt_tokens(sim: SimulatedHost, path: str) -> int:
    """The prompt's tokens as the simulator counts them (its own count endpoint)."""
    if path in COUNTS:
        code, data, _ = await post(sim, COUNTS[path], BODIES[path])
        assert code == 200
        return int(json.loads(data)["input_tokens"])
    # A completion: its text's tokens and the start token.
    from crossbar.testing.simulator.cache import prompt_tokens as count

    return len(count({"prompt": LONG}, chat=False))


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
@pytest_twisted.ensureDeferred
async def test_a_prompt_longer_than_the_slot_is_refused_as_llama_server_refuses_it(
    path: str, stream: bool
) -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, ctx=2048)
    n = await prompt_tokens(sim, path)
    assert n > 2048
    code, data, headers = await post(sim, path, {**BODIES[path], "stream": stream})
    expected = (
        f'{{"error":{{"code":400,"message":"request ({n} tokens) exceeds the available context'
        ' size (2048 tokens), try increasing it","type":"exceed_context_size_error",'
        f'"n_prompt_tokens":{n},"n_ctx":2048}}}}'
    ).encode()
    assert (code, data) == (400, expected)  # plain JSON before any head, streamed or not
    assert headers.getRawHeaders(b"content-type") == [b"application/json; charset=utf-8"]
    assert sim.prefills == []  # no slot was taken


@pytest.mark.parametrize("path", list(BODIES))
@pytest_twisted.ensureDeferred
async def test_the_same_prompt_fits_a_larger_slot_and_a_prompt_as_long_as_the_slot_does_not(
    path: str,
) -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, ctx=8192)
    n = await prompt_tokens(sim, path)
    code, _, _ = await post(sim, path, BODIES[path])
    assert code == 200
    sim.ctx = {"tiny-a": n}  # llama-server refuses n_tokens >= n_ctx
    code, data, _ = await post(sim, path, BODIES[path])
    assert code == 400 and json.loads(data)["error"]["n_ctx"] == n
    sim.ctx = {"tiny-a": n + 1}
    code, data, _ = await post(sim, path, BODIES[path])
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_an_answer_stops_where_the_window_ends() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, chunks=500)
    n = await prompt_tokens(sim, "/v1/chat/completions")
    sim.ctx = n + 11  # room for 10 tokens
    code, data, _ = await post(sim, "/v1/chat/completions", BODIES["/v1/chat/completions"])
    answer = json.loads(data)
    assert code == 200 and answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 10


@pytest_twisted.ensureDeferred
async def test_the_window_is_told_in_props_and_meta_per_model() -> None:
    sim = SimulatedHost({"tiny-a": "loaded", "tiny-b": "loaded"}, slots=2, ctx={"tiny-a": 4096})
    stub = StubTreq(sim.resource)
    props = await stub.json_content(await stub.get("http://sim/props?model=tiny-a&autoload=false"))
    assert props["default_generation_settings"]["n_ctx"] == 4096
    listing = await stub.json_content(await stub.get("http://sim/v1/models"))
    meta = {entry["id"]: entry["meta"] for entry in listing["data"]}
    assert (meta["tiny-a"]["n_ctx"], meta["tiny-a"]["n_ctx_train"]) == (8192, 8192)
    assert meta["tiny-b"]["n_ctx_train"] == 2048  # no window: as before
    code, _, _ = await post(sim, "/v1/chat/completions", {**BODIES["/v1/chat/completions"]})
    assert code == 400
    stub_b = await stub.post(
        "http://sim/v1/chat/completions", json={"model": "tiny-b", **BODIES["/v1/chat/completions"]}
    )
    assert stub_b.code == 200  # tiny-b has no window


@pytest_twisted.ensureDeferred
async def test_a_single_model_server_tells_its_window_in_its_own_props() -> None:
    sim = SimulatedHost({"m.gguf": "loaded"}, router=False, ctx=1024, slots=4)
    stub = StubTreq(sim.resource)
    props = await stub.json_content(await stub.get("http://sim/props"))
    listing = await stub.json_content(await stub.get("http://sim/v1/models"))
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert listing["data"][0]["meta"]["n_ctx"] == 4096


def test_the_demo_s_hosts_have_different_windows() -> None:
    assert len(set(WINDOWS.values())) == len(WINDOWS) == 3


def test_the_command_line_takes_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    class Made:
        url = "http://127.0.0.1:1"

        def __init__(self, models: Any, **kwargs: Any) -> None:
            made.append(kwargs)

        def listen(self, port: int, interface: str) -> None:
            pass

    from twisted.internet import reactor

    monkeypatch.setattr("crossbar.testing.simulator.__main__.SimulatedHost", Made)
    monkeypatch.setattr(reactor, "run", lambda: None)
    simulator_main(["--ctx", "2048", "--listen", "0"])
    assert made[0]["ctx"] == 2048

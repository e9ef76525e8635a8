"""crossbar.testing.simulator.savedslots: slots saved and restored as llama-server does with
``--slot-save-path``: a new conversation sharing the saved system prompt prefills only its
own tokens; without a save path 501; another model's file refused."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.task import Clock

from crossbar.testing import SimulatedHost

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 60}


async def call(sim: SimulatedHost, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    stub = StubTreq(sim.resource)
    data = None if body is None else json.dumps(body).encode()
    response = await stub.request(method, "http://sim" + path, data=data)
    return response.code, json.loads(await response.content())


async def chat(sim: SimulatedHost, first: str, model: str = "tiny-a") -> dict[str, Any]:
    body = {"model": model, "messages": [SYSTEM, {"role": "user", "content": first}]}
    code, answer = await call(sim, "POST", "/v1/chat/completions", body | {"max_tokens": 4})
    assert code == 200
    return answer["timings"]  # type: ignore[no-any-return]


@pytest_twisted.ensureDeferred
async def test_a_restored_slot_spares_a_new_conversation_the_shared_prefix() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, slots=2, cache_ram=0)
    sim.saved_slots.enabled = True
    first = await chat(sim, "fix the tests")
    assert first["cache_n"] == 0
    code, slots = await call(sim, "GET", "/slots?model=tiny-a")
    used = [s for s in slots if "id_task" in s]
    assert code == 200 and len(used) == 1 and used[0]["n_prompt_tokens"] > first["prompt_n"]
    free = next(s["id"] for s in slots if "id_task" not in s)
    saved = await call(sim, "POST", f"/slots/{used[0]['id']}?action=save",
                       {"filename": "p.bin", "model": "tiny-a"})  # fmt: skip
    assert saved[0] == 200 and saved[1]["n_saved"] == used[0]["n_prompt_tokens"]
    # the used slot now takes another conversation, so only the restore can help the next
    other = {"model": "tiny-a", "messages": [{"role": "user", "content": "x " * 50}]}
    await call(sim, "POST", "/v1/chat/completions", other)
    restored = await call(sim, "POST", f"/slots/{free}?action=restore",
                          {"filename": "p.bin", "model": "tiny-a"})  # fmt: skip
    assert restored[0] == 200
    second = await chat(sim, "write the docs")
    assert (
        second["cache_n"] > 0.9 * first["prompt_n"]
        and second["prompt_n"] < 0.05 * first["prompt_n"]
    )


@pytest_twisted.ensureDeferred
async def test_a_host_without_a_save_path_says_so() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"})
    await chat(sim, "hello")
    code, answer = await call(
        sim, "POST", "/slots/0?action=save", {"filename": "p.bin", "model": "tiny-a"}
    )
    assert code == 501 and "--slot-save-path" in answer["error"]["message"]
    assert answer["error"]["type"] == "not_supported_error"


@pytest_twisted.ensureDeferred
async def test_a_file_of_another_model_or_a_path_is_refused() -> None:
    sim = SimulatedHost({"tiny-a": "loaded", "tiny-b": "loaded"})
    sim.saved_slots.enabled = True
    await chat(sim, "hello")
    await call(sim, "POST", "/slots/0?action=save", {"filename": "p.bin", "model": "tiny-a"})
    code, answer = await call(
        sim, "POST", "/slots/0?action=restore", {"filename": "p.bin", "model": "tiny-b"}
    )
    assert code == 400 and "invalid slot save file" in answer["error"]["message"]
    code, answer = await call(
        sim, "POST", "/slots/0?action=save", {"filename": "../p.bin", "model": "tiny-a"}
    )
    assert code == 400 and answer["error"]["message"] == "Invalid filename"


@pytest_twisted.ensureDeferred
async def test_props_tell_a_new_start_of_the_model_server() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"})
    before = (await call(sim, "GET", "/props?model=tiny-a&autoload=false"))[1]
    await call(sim, "POST", "/models/unload", {"model": "tiny-a"})
    await call(sim, "POST", "/models/load", {"model": "tiny-a"})
    after = (await call(sim, "GET", "/props?model=tiny-a&autoload=false"))[1]
    assert before["build_info"] == after["build_info"]
    assert before["media_marker"] != after["media_marker"]


def test_a_save_of_a_busy_slot_is_answered_once_its_request_ends() -> None:
    clock = Clock()
    sim = SimulatedHost({"tiny-a": "loaded"}, reactor=clock, chunks=10, chunk_interval=0.1)
    sim.saved_slots.enabled = True
    stub = StubTreq(sim.resource)
    body = {"model": "tiny-a", "messages": [SYSTEM, {"role": "user", "content": "fix it"}]}
    answered: list[Any] = []
    stub.post("http://sim/v1/chat/completions", json=body).addCallback(answered.append)
    clock.advance(0)
    stub.flush()
    state = sim.cache()
    assert state is not None and True in state.busy
    busy = state.busy.index(True)
    saved: list[Any] = []
    asked = stub.post(f"http://sim/slots/{busy}?action=save",
                      json={"filename": "p.bin", "model": "tiny-a"})  # fmt: skip
    asked.addCallback(stub.json_content).addCallback(saved.append)
    clock.advance(0.5)
    stub.flush()
    assert not saved and not answered  # held while the turn runs
    clock.advance(1.0)
    stub.flush()
    after = sim.cache()
    assert answered and after is not None and not after.busy[busy]
    assert saved == [{"id_slot": busy, "filename": "p.bin", "n_saved": after.slots[busy]}]

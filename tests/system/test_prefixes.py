"""A shared prompt prefix prefilled once per host, not once per conversation: crossbar in
front of a simulated host started with ``--slot-save-path`` saves a slot holding an agent's
system prompt once two new conversations began with it (after any turn of theirs), and
restores it into a free slot before each later new conversation, which then prefills only
its own tokens. A host
without a save path is asked once, and its conversations go on as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred

from crossbar.config import RouteConfig
from crossbar.testing import Rig, RigMaker, SimulatedHost, guard, rigs

SYSTEM = {"role": "system", "content": "You are a careful coding agent with many tools. " * 80}
ROUTE = {"lab": RouteConfig("lab", ("gpu-a",), "tiny-a", "cache_affinity")}


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


async def new_conversation(rig: Rig, first: str) -> None:
    body: dict[str, Any] = {"model": "tiny-a", "max_tokens": 3}
    body["messages"] = [SYSTEM, {"role": "user", "content": first}]
    response, _ = await rig.post("/lab/v1/chat/completions", body)
    assert response.code == 200


async def saving_host(make: RigMaker) -> tuple[Rig, SimulatedHost]:
    """crossbar in front of a simulated host started with ``--slot-save-path``."""
    sim = SimulatedHost({"tiny-a": "loaded"}, chunks=3, slots=4, cache_ram=0)
    sim.saved_slots.enabled = True
    return await make({"gpu-a": sim}, ROUTE), sim


def slot_action(sim: SimulatedHost) -> Deferred[str]:
    """The next slot action crossbar asks of ``sim``: its target."""

    async def watch() -> str:
        while not (recorded := await sim.wait_request()).path.startswith("/slots/"):
            pass
        return recorded.path

    return Deferred.fromCoroutine(watch())


async def prefilled_beside_a_live_conversation(rig: Rig, sim: SimulatedHost) -> list[int]:
    """Two new conversations, one after the other (the second shares the first's slot);
    then a third while the first's next turn still runs in its slot: what each prefilled."""
    await new_conversation(rig, "fix the tests")
    saving = slot_action(sim)
    await new_conversation(rig, "write the docs")
    await saving  # after the second: the prefix is popular
    sim.chunk_interval = 30.0  # the live turn holds its slot
    body: dict[str, Any] = {"model": "tiny-a", "stream": True, "max_tokens": 3}
    first = {"role": "user", "content": "write the docs"}
    answer, next_ask = {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}
    body["messages"] = [SYSTEM, first, answer, next_ask]
    _, live = await rig.stream("/lab/v1/chat/completions", body)
    await live.bytes()
    sim.chunk_interval = 0.0
    await new_conversation(rig, "add a flag")
    live.hang_up()
    return [p.prompt_n for p in sim.prefills]


@pytest_twisted.ensureDeferred
async def test_a_new_conversation_beside_a_live_one_prefills_only_its_own_tokens(
    make: RigMaker,
) -> None:
    rig, sim = await saving_host(make)
    first, _, _, beside = await prefilled_beside_a_live_conversation(rig, sim)
    assert beside < 0.05 * first
    actions = [r.path.split("action=")[1] for r in sim.requests if r.path.startswith("/slots/")]
    assert actions == ["save", "restore"]
    _, data = await rig.get("/_crossbar/status")
    shown = json.loads(data)["prefixes"]
    assert [(r["route"], r["new_conversations"]) for r in shown["shared"]] == [("lab", 3)]
    assert shown["hosts"][0]["host"] == "gpu-a" and shown["hosts"][0]["allows_saves"] is True
    assert shown["hosts"][0]["restores"] == 1


async def held(rig: Rig, sim: SimulatedHost, messages: list[dict[str, str]]) -> Any:
    """A turn streaming on ``sim``, its slot held until the reader hangs up."""
    sim.chunk_interval = 30.0
    body = {"model": "tiny-a", "stream": True, "max_tokens": 3, "messages": messages}
    _, live = await rig.stream("/lab/v1/chat/completions", body)
    await live.bytes()
    sim.chunk_interval = 0.0
    return live


@pytest_twisted.ensureDeferred
async def test_a_prefix_popular_after_the_first_turn_is_saved_after_a_later_one(
    make: RigMaker,
) -> None:
    rig, sim = await saving_host(make)
    await new_conversation(rig, "fix the tests")  # seen once: not saved
    first = [SYSTEM, {"role": "user", "content": "fix the tests"}]
    second = await held(rig, sim, [SYSTEM, {"role": "user", "content": "write the docs"}])
    saving = slot_action(sim)
    answer, go = {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}
    response, _ = await rig.post("/lab/v1/chat/completions", {"model": "tiny-a",
                                 "max_tokens": 3, "messages": [*first, answer, go]})  # fmt: skip
    assert response.code == 200
    assert (await guard(saving, 5, "save")).endswith("?action=save")
    again = {"role": "user", "content": "again"}
    first_live = await held(rig, sim, [*first, answer, go, answer, again])
    await new_conversation(rig, "add a flag")  # both others live: a restored slot, or none
    second.hang_up()
    first_live.hang_up()
    whole, beside = sim.prefills[0].prompt_n, sim.prefills[-1].prompt_n
    assert beside < 0.05 * whole


@pytest_twisted.ensureDeferred
async def test_a_new_conversation_takes_the_restored_slot_not_a_live_ones(
    make: RigMaker,
) -> None:
    rig, sim = await saving_host(make)
    await new_conversation(rig, "fix the tests")
    answer, go = {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}
    busy = await held(rig, sim, [SYSTEM, {"role": "user", "content": "fix the tests"}, answer, go])
    saving = slot_action(sim)
    await new_conversation(rig, "write the docs")  # beside it, in a slot of its own
    assert (await guard(saving, 5, "save")).endswith("?action=save")
    busy.hang_up()
    own = {"role": "user", "content": "add a flag to the command line. " * 20}
    body = {"model": "tiny-a", "max_tokens": 3, "messages": [SYSTEM, own]}
    assert (await rig.post("/lab/v1/chat/completions", body))[0].code == 200
    await new_conversation(rig, "bump the version")  # every other slot idle, the same prefix
    body["messages"] = [SYSTEM, own, answer, go]  # the third one's next turn
    assert (await rig.post("/lab/v1/chat/completions", body))[0].code == 200
    assert sim.prefills[-1].prompt_n < 0.05 * sim.prefills[0].prompt_n


@pytest_twisted.ensureDeferred
async def test_a_host_without_a_save_path_is_asked_once_and_serves_as_before(
    make: RigMaker,
) -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, chunks=3, slots=4, cache_ram=0)
    rig = await make({"gpu-a": sim}, ROUTE)
    first, _, _, beside = await prefilled_beside_a_live_conversation(rig, sim)
    assert beside > 0.9 * first  # the shared prefix again, in an empty slot
    asked = [r.path for r in sim.requests if r.path.startswith("/slots/")]
    assert len(asked) == 1 and asked[0].endswith("?action=save")

"""End to end: the official openai client, through crossbar, to simulated llama-server routers.

``fleet`` is crossbar in front of two simulators, built with crossbar.testing's rig.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.config import HostSettings
from crossbar.testing import Rig, SimulatedHost, build, teardown


@pytest_twisted.async_yield_fixture
async def fleet(reactor: Any) -> AsyncIterator[Rig]:
    sims = {
        "gpu-a": SimulatedHost({"tiny-a": "loaded", "tiny-b": "unloaded"}, chunks=6),
        "gpu-b": SimulatedHost({"tiny-b": "loaded", "tiny-a": "unloaded"}, chunks=6),
    }
    built = await build(sims, defaults=HostSettings(poll_interval=60.0))
    yield built
    await teardown(built)


def client(fleet: Rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.base}/lab/v1", api_key="sk-unused", max_retries=0)


@pytest_twisted.ensureDeferred
async def test_openai_client_non_streaming(fleet: Rig) -> None:
    def ask() -> Any:
        with client(fleet) as c:
            return c.chat.completions.with_raw_response.create(
                model="tiny-b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )

    raw = await deferToThread(ask)
    assert raw.headers["x-crossbar-host"] == "gpu-b"
    completion = raw.parse()
    assert completion.model == "tiny-b"
    assert completion.choices[0].message.content == "abcd"
    sent = fleet.sims["gpu-b"].requests[-1]
    assert sent.json()["model"] == "tiny-b"


@pytest_twisted.ensureDeferred
async def test_openai_client_streaming(fleet: Rig) -> None:
    def ask() -> list[str]:
        with client(fleet) as c:
            stream = c.chat.completions.create(
                model="tiny-a",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                stream=True,
            )
            return [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]

    pieces = await deferToThread(ask)
    assert "".join(pieces) == "abcde"
    assert len([p for p in pieces if p]) == 5
    assert fleet.sims["gpu-b"].requests == [
        r
        for r in fleet.sims["gpu-b"].requests
        if r.path in ("/health", "/v1/models") or r.path.startswith("/props")  # polls
    ]


@pytest_twisted.ensureDeferred
async def test_openai_models_list_and_default_model(fleet: Rig) -> None:
    def ask() -> tuple[list[str], str | None]:
        with client(fleet) as c:
            models = [m.id for m in c.models.list()]
            # extra_body can't remove "model", so post raw JSON with no model at all
            answer = c.post(
                "/chat/completions",
                body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                cast_to=dict,
            )
            return models, answer.get("model")

    models, model = await deferToThread(ask)
    assert models == ["tiny-a", "tiny-b"]  # gpu-a answers: first healthy host
    assert model == "tiny-a"  # the route's default model was filled in


@pytest_twisted.ensureDeferred
async def test_failure_then_recovery_story(fleet: Rig) -> None:
    """Down after a failed request, still down after one good poll, up after two."""
    sim = fleet.sims["gpu-a"]
    table = fleet.crossbar.table
    await sim.refuse()

    def ask() -> str:
        with client(fleet) as c:
            raw = c.chat.completions.with_raw_response.create(
                model="tiny-a", messages=[], max_tokens=1
            )
            return str(raw.headers["x-crossbar-host"])

    # the request fails over to gpu-b, which knows tiny-a and loads it
    assert await deferToThread(ask) == "gpu-b"
    state = table.get("gpu-a")
    assert state is not None and not state.healthy
    assert state.last_err == "marked down: connection refused"
    assert fleet.sims["gpu-b"].status("tiny-a") == "loaded"
    # while gpu-a is down, tiny-a goes to gpu-b directly
    assert await deferToThread(ask) == "gpu-b"

    await sim.listen()
    await fleet.crossbar.poller.poll_now("gpu-a")
    state = table.get("gpu-a")
    assert state is not None and (state.healthy, state.consecutive) == (False, 1)
    await fleet.crossbar.poller.poll_now("gpu-a")
    state = table.get("gpu-a")
    assert state is not None and (state.healthy, state.consecutive) == (True, 2)

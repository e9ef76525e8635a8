"""Routing by fit against simulated hosts with different windows (``SimulatedHost(ctx=...)``,
which refuses a prompt too long as llama-server does): a prompt too long for one host is
answered by the other on chat, completions, messages and responses, streamed or not; a
prompt too long for every host gets its API's own error with the real numbers; a window
never read is learned from a host's refusal; a cache_affinity conversation stays home
while it fits, then moves once and stays."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted

from crossbar.config import RouteConfig
from crossbar.testing import Rig, RigMaker, SimulatedHost, rigs
from tests.support.affinity import host_header

ROUTE = {"lab": RouteConfig("lab", ("small", "big"), "tiny-a")}
PATHS = {
    "/lab/v1/chat/completions": lambda text: {"messages": [{"role": "user", "content": text}]},
    "/lab/v1/completions": lambda text: {"prompt": text},
    "/lab/v1/messages": lambda text: {
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
    },
    "/lab/v1/responses": lambda text: {"input": text},
}


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


async def fleet(make: RigMaker, **routes: Any) -> tuple[Rig, SimulatedHost, SimulatedHost]:
    small = SimulatedHost({"tiny-a": "loaded"}, ctx=2048)
    big = SimulatedHost({"tiny-a": "loaded"}, ctx=8192)
    rig = await make({"small": small, "big": big}, routes=routes or ROUTE)
    return rig, small, big


def asked(path: str, stream: bool, words: int) -> dict[str, Any]:
    return {"model": "tiny-a", "stream": stream, **PATHS[path]("word " * words)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("stream", [False, True])
@pytest_twisted.ensureDeferred
async def test_a_prompt_too_long_for_one_host_is_answered_by_the_other(
    make: RigMaker, path: str, stream: bool
) -> None:
    rig, _, big = await fleet(make)
    response, data = await rig.post(path, asked(path, stream, 10))
    assert response.code == 200 and host_header(response) == "small"  # short: first host
    response, data = await rig.post(path, asked(path, stream, 3000))
    assert response.code == 200, data
    assert host_header(response) == "big" and len(big.prefills) == 1
    if stream:
        assert b"[DONE]" in data or b"message_stop" in data or b"response.completed" in data


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("stream", [False, True])
@pytest_twisted.ensureDeferred
async def test_a_prompt_too_long_for_every_host_gets_its_api_s_own_error(
    make: RigMaker, path: str, stream: bool
) -> None:
    rig, small, big = await fleet(make)
    response, data = await rig.post(path, asked(path, stream, 9000))
    assert response.code == 400, data
    error = json.loads(data)
    if path.endswith("/messages"):
        assert error["type"] == "error"
        message = error["error"]["message"]
        assert message.startswith("prompt is too long: ") and message.endswith(
            " tokens > 8192 maximum"
        )
        assert int(message.split()[4]) > 8192
    else:
        assert error["error"]["code"] == "context_length_exceeded"
        assert error["error"]["type"] == "invalid_request_error"
        assert "8192" in error["error"]["message"]
    assert not small.prefills and not big.prefills


@pytest_twisted.ensureDeferred
async def test_a_window_never_read_is_learned_from_the_refusal_and_then_avoided(
    make: RigMaker,
) -> None:
    rig, _, big = await fleet(make)
    rig.crossbar.table.record_window("small", "tiny-a", None)  # as if never read
    rig.crossbar.table.record_window("big", "tiny-a", None)
    body = asked("/lab/v1/chat/completions", False, 2500)
    response, data = await rig.post("/lab/v1/chat/completions", body)
    assert response.code == 200, data
    assert host_header(response) == "big"
    assert len(rig.completions("small")) == 1 and len(big.prefills) == 1  # refused, retried
    assert rig.state("small").window("tiny-a") == 2048
    assert rig.logs.matching("(moved: ", "tokens > small's window 2048)")  # the access line
    response, _ = await rig.post("/lab/v1/chat/completions", body)
    assert response.code == 200 and len(rig.completions("small")) == 1  # not again


def turn(first: str, turns: int, words: int) -> dict[str, Any]:
    """Turn ``turns`` of a chat that began with ``first``, each answer ``words`` words long."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for n in range(1, turns):
        messages += [
            {"role": "assistant", "content": "done " * words},
            {"role": "user", "content": f"next {n}"},
        ]
    return {"model": "tiny-a", "max_tokens": 16, "messages": messages}


@pytest_twisted.ensureDeferred
async def test_a_cache_affinity_conversation_stays_home_while_it_fits_then_moves_once(
    make: RigMaker,
) -> None:
    route = RouteConfig("lab", ("small", "big"), "tiny-a", "cache_affinity")
    rig, _, _ = await fleet(make, lab=route)
    path = "/lab/v1/chat/completions"
    for n in range(40):  # a conversation whose home is the small host
        first = f"task {n}"
        response, _ = await rig.post(path, turn(first, 1, 0))
        if host_header(response) == "small":
            break
    else:
        pytest.fail("no conversation lives on the small host")
    where = []
    for turns in range(2, 12):
        response, data = await rig.post(path, turn(first, turns, 150))
        assert response.code == 200, data
        where.append(host_header(response))
    moved = where.index("big")
    assert moved > 0, where  # it stayed home while it fitted
    assert set(where[:moved]) == {"small"} and set(where[moved:]) == {"big"}, where

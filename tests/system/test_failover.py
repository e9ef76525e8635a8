"""Failover until the first content, over real loopback sockets: a simulated host that
sends its stream's head and a ping, then dies mid-prefill (its connection reset), is
replaced by the route's next host, in the same stream, on chat, Messages and Responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted

from crossbar.testing import RigMaker, SimulatedHost, rigs
from tests.support import header

ENDS = {
    "/lab/v1/chat/completions": (b"data: [DONE]", b'"role":"assistant"'),
    "/lab/v1/messages": (b"event: message_stop", b"event: message_start"),
    "/lab/v1/responses": (b"event: response.completed", b"event: response.created"),
}
HI = [{"role": "user", "content": "hi"}]


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


@pytest.mark.parametrize("path", list(ENDS))
@pytest_twisted.ensureDeferred
async def test_a_host_killed_mid_prefill_is_replaced_and_the_stream_completes(
    make: RigMaker, path: str
) -> None:
    rig = await make({name: SimulatedHost(chunks=4) for name in ("gpu-a", "gpu-b")})
    rig.sims["gpu-a"].fault = "die_in_prefill"
    body: dict[str, Any] = {"model": "tiny-a", "stream": True, "max_tokens": 8}
    body.update({"input": "hi"} if path.endswith("responses") else {"messages": HI})
    response, reader = await rig.stream(path, body)
    assert response.code == 200
    await reader.end(10)
    end, first = ENDS[path]
    assert end in reader.data and reader.data.count(first) == 1
    assert header(response, "x-crossbar-host") == "gpu-a"  # its head and ping came first
    assert len(rig.sims["gpu-b"].requests) >= 1
    line = rig.logs.matching(f"lab gpu-b POST {path.removeprefix('/lab')} 200")
    assert line and "(tried gpu-a: broke before any content" in str(line)

"""crossbar.testing for real: importing it installs no reactor (a fresh interpreter), and the
rig answers through crossbar on real ports, waits for a state and is torn down.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import pytest_twisted
from twisted.logger import Logger

from crossbar.testing import (
    SimulatedHost,
    broken,
    rigs,
    wait_state,
)
from tests.support.ports import refused

CHAT = "/lab/v1/chat/completions"


# -- the package --------------------------------------------------------------------------------


def test_importing_installs_no_reactor() -> None:
    """Programs must be able to pick their reactor after importing the test doubles."""
    code = "import sys, crossbar.testing; print('twisted.internet.reactor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the rig ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_rig_answers_through_crossbar_and_is_torn_down() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, chunks=3)
    async with rigs() as make:
        rig = await make({"gpu-a": sim, "gpu-b": "http://127.0.0.1:1"}, up=("gpu-a",))
        assert rig.base == f"http://127.0.0.1:{rig.port}"
        assert set(rig.sims) == {"gpu-a"}
        assert rig.state("gpu-a").healthy
        assert rig.state("gpu-b").url == "http://127.0.0.1:1"
        with pytest.raises(AssertionError):
            rig.state("nope")
        assert rig.logs.matching("host gpu-a is up")

        response, body = await rig.post(CHAT, {"model": "tiny-a", "messages": []})
        assert response.code == 200
        assert json.loads(body)["choices"][0]["message"]["content"] == "abc"
        response, body = await rig.get("/lab/v1/models")
        assert response.code == 200

        response, reader = await rig.stream(CHAT, {"model": "tiny-a", "stream": True})
        assert response.code == 200
        assert not broken(await reader.end())
        assert reader.data.endswith(b"data: [DONE]\n\n")
        assert [json.loads(b).get("stream") for b in rig.completions("gpu-a")] == [None, True]
        sim_port, crossbar_port = int(sim.url.rsplit(":", 1)[1]), rig.port
    assert sim.open_connections == 0
    assert refused(sim_port) and refused(crossbar_port)
    Logger(namespace="test").info("after the teardown")
    assert not rig.logs.matching("after the teardown")


@pytest_twisted.ensureDeferred
async def test_wait_state_waits_for_the_change_or_fails_naming_it() -> None:
    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost()})
        await wait_state(rig, "gpu-a", healthy=True, seconds=0.05)  # already true
        rig.crossbar.table.mark_down("gpu-a", "test")
        await wait_state(rig, "gpu-a", healthy=False, seconds=1.0)
        with pytest.raises(AssertionError, match=r"no gpu-a up within 0\.05s"):
            await wait_state(rig, "gpu-a", healthy=True, seconds=0.05)

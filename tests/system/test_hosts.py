"""The hosts' machinery changed by a reload as one: table, traffic, pools and poller
always name the same hosts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest_twisted

from crossbar.config import Config, HostConfig
from crossbar.config.changes import compare
from crossbar.testing import RigMaker, SimulatedHost, eventually, guard, rigs
from crossbar.testing.rig import wait_state

CHAT = "/lab/v1/chat/completions"
ASK = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


def only(config: Config, name: str, url: str) -> Config:
    """``config`` with one host, ``name`` at ``url``, the only one of route ``lab``."""
    lab = attrs.evolve(config.routes["lab"], hosts=(name,))
    host = HostConfig(name, url, config.hosts[name].settings if name in config.hosts else None)
    return attrs.evolve(config, hosts={name: host}, routes={"lab": lab})


@pytest_twisted.ensureDeferred
async def test_a_name_back_at_a_new_address_before_its_last_request_ended(
    make: RigMaker,
) -> None:
    """Removed while streaming, then configured again elsewhere: a new host, whose
    requests never reuse a connection to the old address."""
    old_home = SimulatedHost(chunks=40, chunk_interval=0.02)
    rig = await make({"gpu-a": old_home, "gpu-b": SimulatedHost()})
    new_home = SimulatedHost()
    await new_home.listen(0, "127.0.0.1")
    try:
        start = rig.crossbar.config
        assert (await rig.post(CHAT, ASK))[0].code == 200  # leaves an idle connection
        _, reader = await rig.stream(CHAT, {**ASK, "stream": True})
        await guard(reader.bytes(1), 2, "first chunk")
        rig.reload(only(start, "gpu-b", start.hosts["gpu-b"].url))
        assert rig.crossbar.traffic.leaving.keys() == {"gpu-a"}
        rig.reload(only(start, "gpu-a", new_home.url))
        assert rig.state("gpu-a").state == "unknown"
        await wait_state(rig, "gpu-a", healthy=True)
        for _ in range(3):
            assert (await rig.post(CHAT, ASK))[0].code == 200
        served = [r for r in new_home.requests if r.path.endswith("/completions")]
        assert len(served) == 3
        assert len(rig.completions("gpu-a")) == 2  # the first two, at the old address
        await reader.end(5)
        assert b"data: [DONE]" in reader.data
    finally:
        await new_home.stop()


@pytest_twisted.ensureDeferred
async def test_apply_keeps_every_part_naming_the_same_hosts(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost(), "gpu-b": SimulatedHost()})
    hosts = rig.crossbar.hosts
    start = rig.crossbar.config
    changes = compare(start, only(start, "gpu-b", start.hosts["gpu-b"].url))
    assert hosts.apply(changes) == []  # gpu-a carried nothing: gone at once
    assert hosts.table.names == ["gpu-b"]
    assert list(hosts.traffic.in_flight) == ["gpu-b"]
    assert list(hosts.recent.hosts()) == ["gpu-b"]
    assert list(hosts.hourly.hosts()) == ["gpu-b"]  # the removed host's hour is freed
    await eventually(lambda: rig.state("gpu-b").healthy, 2, "gpu-b still up")

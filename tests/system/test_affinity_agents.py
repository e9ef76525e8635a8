"""cache_affinity behind replicas, for each API a coding agent speaks: chat completions,
Claude Code's Messages and Codex's Responses.

Two crossbars in one process, sharing nothing but the hosts they route to (``slots: 2``
each), take turns of the same conversations. They agree on where each one lives only
because every request tells its turn (tests/unit/routing/test_affinity.py has the rules): a replica
that first sees a conversation at a later turn knows another one answered it, and ranks
it. An API whose turn count were wrong (always 0, say) would leave each replica placing
conversations on its own view, and every other turn on a host without its cache.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator

import attrs
import pytest
import pytest_twisted

from crossbar.config import Config
from crossbar.proxy.shapes import read_conversation
from crossbar.routing.rendezvous import rendezvous
from crossbar.testing import Rig, RigMaker, rigs
from tests.support.affinity import (
    Shape,
    affinity_route,
    chat_turn,
    claude_turn,
    codex_turn,
    host_header,
    hosts,
)

GROUP = ["gpu-a", "gpu-b"]
SHAPES = pytest.mark.parametrize(
    "shape", [chat_turn, claude_turn, codex_turn], ids=["chat", "claude-code", "codex"]
)


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


def conversation_home(shape: Shape, first: str) -> str:
    """The home of the conversation ``shape`` begins with ``first``, as crossbar reads it
    from the body of its first turn (turn 0)."""
    path, data = shape(first, 1)
    route_path = path.removeprefix("/lab").encode()
    found = read_conversation(route_path, json.dumps(data).encode(), "tiny-a")
    assert found is not None and found.turn == 0
    return rendezvous(found.key, GROUP)[0]


def homed(shape: Shape, host: str, count: int) -> list[str]:
    """First words of ``count`` conversations of ``shape`` whose home is ``host``."""
    firsts = (f"task {n}" for n in itertools.count(1))
    return list(itertools.islice((f for f in firsts if conversation_home(shape, f) == host), count))


def two_slots(config: Config) -> Config:
    hosts = {name: attrs.evolve(host, slots=2) for name, host in config.hosts.items()}
    return attrs.evolve(config, hosts=hosts)


async def replicas(make: RigMaker) -> list[Rig]:
    """Two crossbars with the same config (``slots: 2`` on both hosts) in front of the
    same two simulated hosts."""
    first = await make(hosts(), routes=affinity_route(), adjust=two_slots)
    urls = {name: sim.url for name, sim in first.sims.items()}
    second = await make(urls, routes=affinity_route(), adjust=two_slots, up=GROUP)
    return [first, second]


async def alternate(
    replicas: list[Rig], shape: Shape, firsts: list[str], turns: int
) -> list[list[str]]:
    """Conversations of ``shape`` beginning with ``firsts``, each turn through the other
    replica than the turn before, all first turns at once, then all second ones...: the
    host each turn went to."""
    went: list[list[str]] = [[] for _ in firsts]
    for turn in range(1, turns + 1):
        for n, first in enumerate(firsts):
            path, data = shape(first, turn)
            response, _ = await replicas[(n + turn) % 2].post(path, data)
            assert response.code == 200
            went[n].append(host_header(response))
    return went


@SHAPES
@pytest_twisted.ensureDeferred
async def test_two_replicas_agree_on_hosts_with_slots(make: RigMaker, shape: Shape) -> None:
    """Four conversations whose home is gpu-a, two slots a host: each replica first puts
    the two it sees at home; from the third turn, when each has seen all four (the others
    first at their second turn, so answered elsewhere), they agree on two a host and every
    turn goes where the one before went."""
    firsts = homed(shape, "gpu-a", 4)
    went = await alternate(await replicas(make), shape, firsts, 6)
    assert all(hosts[0] == "gpu-a" for hosts in went), went
    assert all(len(set(hosts[2:])) == 1 for hosts in went), went
    assert Counter(hosts[-1] for hosts in went) == Counter({"gpu-a": 2, "gpu-b": 2}), went

"""Soak: crossbar as a real ``twistd`` process in front of two simulated hosts, under a mix
of streams, client disconnects, upstream resets and host restarts for a bounded time.

Opt-in (``pytest -m soak tests/system/test_soak.py``); ``CROSSBAR_SOAK_SECONDS`` sets the length
(60 s by default).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from crossbar.testing import SimulatedHost
from crossbar.upstream import IDLE_POOL_TIMEOUT
from tests.support import Daemon, memory, start_daemon

SECONDS = float(os.environ.get("CROSSBAR_SOAK_SECONDS", "60"))
CLIENTS = 6
CHAT = "/lab/v1/chat/completions"
CONFIG = """\
poll_interval: 4s
poll_timeout: 2s
connect_timeout: 1s
header_timeout: 5s
idle_timeout: 2s
hosts:
  gpu-a: {a}
  gpu-b: {b}
routes:
  lab:
    hosts: [gpu-a, gpu-b]
    default_model: tiny-a
    policy: round_robin
    when_all_down: try_all
"""
"""The poll interval is longer than the upstream pool's idle timeout (3 s), so that between
two polls crossbar holds no connection to a host at all and the count can reach zero; with
try_all, hosts marked down by the faults are still tried, so requests keep reaching them."""


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


async def sleep(seconds: float) -> None:
    await deferLater(_reactor(), seconds, lambda: None)


def ask(port: int, body: dict[str, Any], hang_up_after: int | None = None) -> str:
    """One client request (blocking); a short word for how it ended."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            response.read()
            return f"status {response.status}"
        if hang_up_after is not None:
            response.read(hang_up_after)
            return "hung up"
        data = response.read()
        if body.get("stream") and not data.endswith(b"data: [DONE]\n\n"):
            return "incomplete"
        return "complete"
    except (http.client.IncompleteRead, ConnectionError) as e:
        return f"broken ({type(e).__name__})"
    except TimeoutError:
        return "client timeout"
    finally:
        conn.close()


async def client(port: int, rng: random.Random, until: float, seen: Counter[str]) -> None:
    """Streams (some read to the end, some abandoned) and plain completions, back to back."""
    while time.monotonic() < until:
        choice = rng.random()
        tokens = rng.randint(5, 150)
        if choice < 0.45:
            body = {"model": "tiny-a", "messages": [], "stream": True, "max_tokens": tokens}
            outcome = await deferToThread(ask, port, body)
            seen[f"stream: {outcome}"] += 1
        elif choice < 0.75:
            body = {"model": "tiny-a", "messages": [], "stream": True, "max_tokens": 2000}
            outcome = await deferToThread(ask, port, body, rng.randint(1, 4000))
            seen[f"disconnect: {outcome}"] += 1
        else:
            body = {"model": "tiny-a", "messages": [], "max_tokens": tokens}
            outcome = await deferToThread(ask, port, body)
            seen[f"plain: {outcome}"] += 1
        if outcome.startswith("status"):
            await sleep(0.02)  # an error answer is quick: do not spin on it


async def chaos(sims: list[SimulatedHost], rng: random.Random, until: float) -> Counter[str]:
    """Now and then one host resets its answers for a while, or restarts."""
    done: Counter[str] = Counter()
    while time.monotonic() < until - 2:
        await sleep(rng.uniform(1.0, 3.0))
        sim = rng.choice(sims)
        if rng.random() < 0.5:
            sim.fault = "reset"
            sim.reset_after = rng.randint(1, 20)
            await sleep(rng.uniform(0.2, 1.0))
            sim.fault = None
            done["resets"] += 1
        else:
            await sim.refuse()
            await sleep(rng.uniform(0.1, 1.5))
            await sim.listen()
            done["restarts"] += 1
    return done


async def sample_memory(daemon: Daemon, until: float, samples: list[int]) -> None:
    while time.monotonic() < until:
        samples.append(memory(daemon.proc.pid)["VmRSS"])
        await sleep(2.0)


async def wait_answered(port: int, limit: float = 20.0) -> str:
    """A normal request, repeated until it succeeds (hosts may still be recovering)."""
    deadline = time.monotonic() + limit
    body = {"model": "tiny-a", "messages": [], "stream": True, "max_tokens": 8}
    outcome = ""
    while time.monotonic() < deadline:
        outcome = await deferToThread(ask, port, body)
        if outcome == "complete":
            return outcome
        await sleep(0.2)
    return outcome


@pytest.mark.soak
@pytest_twisted.ensureDeferred
async def test_soak_streams_disconnects_resets_and_restarts(tmp_path: Path) -> None:
    """After a bounded run of mixed streams, client disconnects, upstream resets and host
    restarts, crossbar still answers, its memory is flat and it holds no upstream
    connection open."""
    rng = random.Random(5)
    sims = [SimulatedHost(chunks=40, chunk_interval=0.002, chunk_size=16) for _ in range(2)]
    daemon = None
    try:
        for sim in sims:
            await sim.listen(0, "127.0.0.1")
        config = CONFIG.format(a=sims[0].url, b=sims[1].url)
        daemon = await deferToThread(start_daemon, tmp_path, config)
        port = daemon.port
        assert await wait_answered(port) == "complete"
        for _ in range(20):  # warm up before the first memory figure
            await deferToThread(ask, port, {"model": "tiny-a", "messages": [], "max_tokens": 4})
        first = memory(daemon.proc.pid)["VmRSS"]

        until = time.monotonic() + SECONDS
        seen: Counter[str] = Counter()
        samples: list[int] = []
        workers = [client(port, random.Random(rng.random()), until, seen) for _ in range(CLIENTS)]
        running = [Deferred.fromCoroutine(w) for w in workers]
        sampler = Deferred.fromCoroutine(sample_memory(daemon, until, samples))
        faults = await Deferred.fromCoroutine(chaos(sims, rng, until))
        await gatherResults([*running, sampler])

        for sim in sims:  # every host back, behaving
            sim.fault = None
            await sim.listen()
        final = await wait_answered(port)
        for _ in range(20):
            await deferToThread(ask, port, {"model": "tiny-a", "messages": [], "max_tokens": 4})
        last = memory(daemon.proc.pid)["VmRSS"]

        # No upstream connection left: with nothing to do, crossbar drops idle ones after
        # IDLE_POOL_TIMEOUT; between two polls every host must see zero connections.
        deadline = time.monotonic() + IDLE_POOL_TIMEOUT + 10
        zero = [False] * len(sims)
        while not all(zero) and time.monotonic() < deadline:
            zero = [z or sim.open_connections == 0 for z, sim in zip(zero, sims, strict=True)]
            await sleep(0.05)
        streams_left = [sim.active_streams for sim in sims]

        print(f"\nsoak {SECONDS:g}s: {dict(faults)}")
        for outcome, count in sorted(seen.items()):
            print(f"  {outcome}: {count}")
        print(
            f"  crossbar VmRSS first {first / 1024:.1f} MiB, last {last / 1024:.1f} MiB, "
            f"samples {[round(s / 1024, 1) for s in samples]}"
        )
        assert final == "complete"
        assert faults["resets"] and faults["restarts"]
        assert seen["stream: complete"] > 50
        assert seen["disconnect: hung up"] > 20
        assert not [o for o in seen if "status 500" in o or "client timeout" in o], seen
        assert daemon.proc.poll() is None, "crossbar exited"
        assert (last - first) / 1024 < 16, "crossbar's memory grew"
        assert all(zero), [sim.open_connections for sim in sims]
        assert streams_left == [0, 0]
    finally:
        if daemon is not None:
            code = await deferToThread(daemon.stop)
            output = daemon.output()
            assert code == 0, output[-3000:]
            assert "Traceback" not in output, output[-3000:]
            assert "Unhandled" not in output, output[-3000:]
        for sim in sims:
            await sim.stop()

"""crossbar.testing.simulator.models: a simulated router's room for models behaves as the
pinned llama-server's does: ``max_instances`` in ``/props``, loads that take ``load_time``,
eviction of the least recently used *idle* model only, and a request that waits while every
loaded model is busy. Driven without sockets (StubTreq) and with a Clock."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.task import Clock

from crossbar.testing import SimulatedHost
from tests.support.simulatorclient import chat, get_json, stub_for, watch


def _router(models: dict[str, str], models_max: int) -> tuple[SimulatedHost, Any, Clock]:
    clock = Clock()
    sim = SimulatedHost(
        models, load_time=2.0, models_max=models_max, chunks=8, chunk_interval=0.125, reactor=clock
    )
    return sim, stub_for(sim), clock


def _step(clock: Clock, stub: Any, seconds: float) -> None:
    """Time passes in eighths (exact in binary), the answers of each delivered before the next."""
    for _ in range(round(seconds * 8)):
        clock.advance(0.125)
        stub.flush()


@pytest_twisted.ensureDeferred
async def test_props_without_a_model_tell_max_instances_and_load_nothing() -> None:
    sim, stub, _ = _router({"a": "loaded", "b": "unloaded"}, 3)
    code, props = await get_json(stub, "/props")
    assert code == 200 and props["role"] == "router"
    assert (props["max_instances"], props["models_autoload"]) == (3, True)
    assert sim.models == {"a": "loaded", "b": "unloaded"} and sim.loads == {}


def test_a_request_for_another_model_waits_while_every_loaded_model_is_busy() -> None:
    sim, stub, clock = _router({"a": "loaded", "b": "unloaded"}, 1)
    busy = watch(stub.post("http://sim/v1/chat/completions", json=chat("a")))  # 1 s answer
    stub.flush()
    waiting = watch(stub.post("http://sim/v1/chat/completions", json=chat("b")))
    _step(clock, stub, 0.5)
    assert sim.models == {"a": "loaded", "b": "unloaded"}  # a is busy: not evicted
    assert sim.evictions == {} and not waiting
    assert sim.room_waits == 1  # counted once, however often it looks again
    _step(clock, stub, 0.5)  # a's answer ends: a is idle, b evicts it and loads
    assert busy and sim.models == {"a": "unloaded", "b": "loading"}
    assert sim.evictions == {"a": 1} and sim.loads == {"b": 1}
    _step(clock, stub, 2.0)
    assert sim.status("b") == "loaded"
    _step(clock, stub, 1.0)
    assert waiting and waiting[0].code == 200  # type: ignore[attr-defined]


def test_the_least_recently_used_idle_model_goes_never_a_busy_one() -> None:
    sim, stub, clock = _router({"a": "loaded", "b": "loaded", "c": "unloaded"}, 2)
    for model in ("a", "b", "a"):  # b is now the least recently used
        watch(stub.post("http://sim/v1/chat/completions", json=chat(model)))
        stub.flush()
    _step(clock, stub, 1.5)
    assert sim.models == {"a": "loaded", "b": "loaded", "c": "unloaded"}
    busy_b = watch(stub.post("http://sim/v1/chat/completions", json=chat("b")))  # b busy now
    stub.flush()
    watch(stub.post("http://sim/v1/chat/completions", json=chat("c")))
    stub.flush()
    assert sim.models == {"a": "unloaded", "b": "loaded", "c": "loading"}  # a: idle, so it goes
    _step(clock, stub, 1.0)
    assert busy_b and sim.evictions == {"a": 1}


def test_two_requests_for_a_waiting_model_start_one_load() -> None:
    sim, stub, clock = _router({"a": "loaded", "b": "unloaded"}, 1)
    watch(stub.post("http://sim/v1/chat/completions", json=chat("a")))
    stub.flush()
    second = [watch(stub.post("http://sim/v1/chat/completions", json=chat("b"))) for _ in "xy"]
    stub.flush()
    _step(clock, stub, 1.0)
    _step(clock, stub, 3.5)
    assert sim.loads == {"b": 1} and all(second)


@pytest_twisted.ensureDeferred
async def test_a_benchmark_reads_the_counts_from_the_simulators_own_path() -> None:
    _, stub, clock = _router({"a": "loaded", "b": "unloaded"}, 1)
    watch(stub.post("http://sim/v1/chat/completions", json=chat("a")))
    stub.flush()
    watch(stub.post("http://sim/v1/chat/completions", json=chat("b")))
    _step(clock, stub, 1.5)
    code, counts = await get_json(stub, "/_simulator/counts")
    assert code == 200
    assert counts == {
        "loads": {"b": 1},
        "evictions": {"a": 1},
        "room_waits": 1,
        "most_waiting_in_host": 0,
    }

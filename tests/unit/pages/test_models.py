"""crossbar.pages.models: what the page, the JSON, the metrics and the log say of a router's
models: in flight and idle per loaded model, "2 of 4 instances", where a model loaded nowhere
would load and what it evicts, and the loads and evictions the polls saw."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet.task import Clock

from crossbar.pages.models import (
    ModelEvents,
    instances_words,
    load_words,
    model_notes,
    models_json,
)
from crossbar.polling.health import HealthTable, HostState
from crossbar.routing.placement import EVICTS, FREE, LOADING, LoadCost, Occupancy
from crossbar.testing import LogCapture


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    yield capture
    capture.close()


def router(loaded: tuple[str, ...], room: int | None = 4) -> HostState:
    known = ("gpt-oss-20b", "qwen-7b", "llama-8b")
    return HostState("gpu-b", "http://b", True, loaded, known, max_instances=room)


def test_each_loaded_model_shows_its_requests_in_flight_or_its_idle_time() -> None:
    state = router(("qwen-7b", "llama-8b"))
    usage = Occupancy({("gpu-b", "qwen-7b"): 2}, {("gpu-b", "llama-8b"): 100.0})
    assert model_notes(state, usage, 940.0) == {"qwen-7b": "2 in flight", "llama-8b": "idle 14 min"}
    assert instances_words(state, usage) == "2 of 4 instances"
    assert models_json(state, usage, 940.0) == {
        "models": {
            "llama-8b": {"in_flight": 0, "idle_seconds": 840.0},
            "qwen-7b": {"in_flight": 2, "idle_seconds": 0.0},
        },
        "instances": {"used": 2, "max": 4},
    }


def test_a_host_without_a_known_room_shows_what_it_did_before() -> None:
    state = router(("qwen-7b",), room=None)
    assert instances_words(state, Occupancy()) is None
    assert model_notes(state, Occupancy(), 0.0) == {}
    slotted = HostState("gpu-a", "http://a", True, ("m",), ("m",), slots={"m": 4})
    assert model_notes(slotted, Occupancy(), 0.0) == {"m": "4 slots"}


def test_where_a_model_would_load_is_said_in_words() -> None:
    evicts = LoadCost("gpu-b", EVICTS, "qwen-7b", 840.0, 0, 4)
    assert load_words(evicts, "gpt-oss-20b") == (
        "(would load gpt-oss-20b, evicting qwen-7b, idle 14 min)"
    )
    free = LoadCost("gpu-b", FREE, free=1, instances=2)
    assert load_words(free, "m") == "(would load m: 1 of 2 instances free)"
    assert load_words(LoadCost("gpu-b", LOADING), "m") == "(loading m there: waits for that load)"


def test_loads_and_evictions_are_counted_and_logged_once_each(logs: LogCapture) -> None:
    clock = Clock()
    clock.advance(1000)
    usage = Occupancy({}, {("gpu-b", "qwen-7b"): 160.0})
    events = ModelEvents(usage, clock)
    table = HealthTable({"gpu-b": "http://b"}, clock, models_changed=events.seen)
    known = ("gpt-oss-20b", "qwen-7b", "llama-8b")
    table.record_ok("gpu-b", ["qwen-7b"], known)  # the first poll: what was loaded before
    table.record_ok("gpu-b", ["qwen-7b"], known)
    assert events.loads == {} and logs.matching("gpu-b") == []
    table.record_ok("gpu-b", ["gpt-oss-20b"], known)
    assert logs.matching("gpu-b") == ["gpu-b loads gpt-oss-20b (evicts qwen-7b, idle 14 min)"]
    table.record_ok("gpu-b", [], known)
    assert logs.matching("unloads") == ["gpu-b unloads gpt-oss-20b (unused since crossbar started)"]
    registry = CollectorRegistry()
    registry.register(events)
    text = generate_latest(registry).decode()
    assert 'crossbar_model_loads_total{host="gpu-b",model="gpt-oss-20b"} 1.0' in text
    assert 'crossbar_model_evictions_total{host="gpu-b",model="qwen-7b"} 1.0' in text
    assert 'crossbar_model_evictions_total{host="gpu-b",model="gpt-oss-20b"} 1.0' in text


def test_each_loaded_model_shows_a_slot_s_window_on_the_page_and_in_the_json() -> None:
    state = HostState(
        "gpu-a", "http://a", True, ("m", "n"), ("m", "n"), slots={"m": 4},
        windows={"m": 16384, "n": 3000}, max_instances=4,
    )  # fmt: skip
    notes = model_notes(state, Occupancy(), 0.0)
    assert notes["m"].startswith("4 slots; 16k tokens a slot")
    assert notes["n"].startswith("3,000 tokens a slot")
    assert models_json(state, Occupancy(), 0.0)["models"]["m"]["window"] == 16384

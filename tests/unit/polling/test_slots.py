"""crossbar.polling.slots: which loaded models' ``/props`` the poller asks for, a few a poll
and again after a while, and what an answer's ``total_slots`` is believed to be."""

from __future__ import annotations

from crossbar.polling.slots import (
    ASK_AGAIN_SECONDS,
    ASKS_PER_POLL,
    MAX_SLOTS,
    SlotAsks,
    props_path,
    total_slots,
)

T0 = 1_000.0


def test_the_path_asks_for_one_model_without_loading_it() -> None:
    assert props_path("qwen") == "/props?model=qwen&autoload=false"
    assert props_path("org/model:Q4 &x=1") == (
        "/props?model=org%2Fmodel%3AQ4%20%26x%3D1&autoload=false"
    )


def test_total_slots_is_read_when_believable_and_unknown_otherwise() -> None:
    assert total_slots(b'{"total_slots": 4, "chat_template": "..."}') == 4
    assert total_slots(b'{"total_slots": %d}' % MAX_SLOTS) == MAX_SLOTS
    for body in (
        b'{"total_slots": 0}',
        b'{"total_slots": %d}' % (MAX_SLOTS + 1),
        b'{"total_slots": "4"}',
        b"{}",
        b'{"error": {"code": 400, "message": "model is not loaded"}}',
        b"<html>",
        b"",
    ):
        assert total_slots(body) is None, body


def test_models_first_seen_are_asked_a_few_a_poll() -> None:
    asks = SlotAsks()
    loaded = [f"m{i}" for i in range(ASKS_PER_POLL + 2)]

    assert asks.due(loaded, T0) == loaded[:ASKS_PER_POLL]
    assert asks.due(loaded, T0 + 1) == loaded[ASKS_PER_POLL:]
    assert asks.due(loaded, T0 + 2) == []


def test_a_model_is_asked_again_after_a_while_oldest_first() -> None:
    asks = SlotAsks()
    asks.due(["a"], T0)
    asks.due(["a", "b"], T0 + 10)

    assert asks.due(["a", "b"], T0 + ASK_AGAIN_SECONDS - 1) == []
    assert asks.due(["b", "a"], T0 + ASK_AGAIN_SECONDS + 10) == ["a", "b"]


def test_a_model_unloaded_and_loaded_again_is_asked_at_once() -> None:
    asks = SlotAsks()
    assert asks.due(["a", "b"], T0) == ["a", "b"]
    assert asks.due(["b"], T0 + 1) == []  # "a" was unloaded: forgotten
    assert asks.due(["a", "b"], T0 + 2) == ["a"]


def test_a_model_listed_twice_is_asked_once() -> None:
    assert SlotAsks().due(["a", "a", "b"], T0) == ["a", "b"]


def test_a_model_newly_loaded_goes_before_one_asked_long_ago() -> None:
    asks = SlotAsks()
    old = [f"old{i}" for i in range(ASKS_PER_POLL)]
    asks.due(old, T0)
    later = T0 + ASK_AGAIN_SECONDS
    assert asks.due([*old, "new"], later) == ["new", *old[: ASKS_PER_POLL - 1]]

"""crossbar.testing.simulator.slots: a simulated host's model servers and their slots. A
request waits, first come first served, while every slot is busy, and a model server that
restarts (or changes its number of slots) starts with an empty prompt cache."""

from __future__ import annotations

import attrs
from twisted.internet.defer import Deferred

from crossbar.testing.simulator.slots import ModelSlots

A = ("a", "b", "c")
B = ("x", "y")


@attrs.define
class Flags:
    slots: int = 1
    cache_ram: int = 0
    slot_similarity: float = 0.1


def take(slots: ModelSlots, tokens: tuple[str, ...], port: int = 40001) -> Deferred:  # type: ignore[type-arg]
    return Deferred.fromCoroutine(slots.take("m", port, tokens))


def test_a_free_slot_is_taken_at_once_and_kept_prompt_is_reused() -> None:
    slots = ModelSlots(Flags(slots=1))
    first = take(slots, A)
    cache, prefill = first.result
    assert prefill.cache_n == 0 and prefill.prompt_n == 3
    slots.give_back(cache, prefill, (*A, "answer"))

    again = take(slots, (*A, "answer", "more"))
    _, prefill = again.result
    assert prefill.cache_n == 4 and prefill.prompt_n == 1
    assert slots.cache("m") is cache


def test_with_every_slot_busy_requests_wait_their_turn_in_order() -> None:
    slots = ModelSlots(Flags(slots=1))
    cache, running = take(slots, A).result
    second, third = take(slots, B), take(slots, B)
    assert not second.called and not third.called

    slots.give_back(cache, running, A)
    assert second.called and not third.called
    slots.give_back(cache, second.result[1], B)
    assert third.called


def test_a_waiting_request_that_is_cancelled_leaves_the_queue() -> None:
    slots = ModelSlots(Flags(slots=1))
    cache, running = take(slots, A).result
    gone, next_one = take(slots, B), take(slots, B)
    gone.cancel()
    gone.addErrback(lambda _: None)

    slots.give_back(cache, running, A)
    assert next_one.called


def test_a_restarted_model_server_starts_with_an_empty_cache() -> None:
    flags = Flags(slots=1)
    slots = ModelSlots(flags)
    cache, prefill = take(slots, A).result
    slots.give_back(cache, prefill, A)

    restarted = take(slots, A, port=40002)  # the model was loaded again elsewhere
    new_cache, prefill = restarted.result
    assert new_cache is not cache and prefill.cache_n == 0

    flags.slots = 2
    _, prefill = take(slots, A, port=40002).result
    assert prefill.cache_n == 0
    state = slots.cache("m").state  # type: ignore[union-attr]
    assert len(state.slots) == 2


def test_requests_waiting_on_a_server_that_restarted_try_the_new_one() -> None:
    flags = Flags(slots=1)
    slots = ModelSlots(flags)
    take(slots, A)  # holds the one slot, never given back
    waiting = take(slots, B)
    assert not waiting.called

    flags.slots = 2
    take(slots, A)  # the server restarts with two slots: the waiting one is woken
    assert waiting.called
    assert waiting.result[1].prompt_n == 2


def test_an_unknown_model_has_no_cache_yet() -> None:
    assert ModelSlots(Flags()).cache("m") is None

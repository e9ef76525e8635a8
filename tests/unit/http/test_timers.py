"""crossbar.http.timers: the one rule for stopping a timer, a deadline that moves
without moving its timer, and the ``Date`` header's value."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.web import http

from crossbar.http.timers import Deadline, http_date, stop


class Due:
    def __init__(self) -> None:
        self.clock = Clock()
        self.passed = 0
        self.deadline = Deadline(self.clock, self.on_due)

    def on_due(self) -> None:
        self.passed += 1

    def passes_in(self, seconds: float) -> None:
        """Not passed a millisecond before ``seconds`` from now, passed at them."""
        self.clock.advance(seconds - 0.001)
        assert self.passed == 0
        self.clock.advance(0.001)
        assert self.passed == 1


def test_a_deadline_passes_once_its_time_has_come() -> None:
    d = Due()
    d.deadline.set(10)
    d.passes_in(10)
    assert d.deadline.due is None
    d.clock.advance(100)
    assert d.passed == 1 and d.clock.getDelayedCalls() == []


def test_set_again_later_it_passes_at_the_new_time_on_one_timer() -> None:
    d = Due()
    d.deadline.set(10)
    for _ in range(5):
        d.clock.advance(4)
        d.deadline.set(10)  # a store: the timer is not moved
        assert len(d.clock.getDelayedCalls()) == 1
    d.passes_in(10)  # the timer fired on the way, and waited for the rest


def test_set_sooner_than_its_timer_it_still_passes_on_time() -> None:
    d = Due()
    d.deadline.set(75)
    d.deadline.set(0.3)
    d.passes_in(0.3)
    d.clock.advance(100)
    assert d.passed == 1 and d.clock.getDelayedCalls() == []


def test_cleared_it_never_passes_and_its_timer_lapses() -> None:
    d = Due()
    d.deadline.set(10)
    d.deadline.clear()
    d.clock.advance(10)
    assert d.passed == 0 and d.clock.getDelayedCalls() == []
    d.deadline.set(10)  # set again after it lapsed: a timer again
    d.passes_in(10)


def test_cleared_then_set_while_its_timer_waits_counts_from_the_new_time() -> None:
    d = Due()
    d.deadline.set(10)
    d.clock.advance(6)
    d.deadline.clear()
    d.clock.advance(2)
    d.deadline.set(10)  # due at 18; the timer set for 10 fires first and waits again
    d.passes_in(10)


def test_stopped_it_holds_no_timer() -> None:
    d = Due()
    d.deadline.set(10)
    d.deadline.stop()
    assert d.clock.getDelayedCalls() == [] and d.deadline.due is None
    d.deadline.stop()  # twice: nothing to stop
    d.clock.advance(10)
    assert d.passed == 0


def test_stop_leaves_a_timer_that_fired_or_was_cancelled_alone() -> None:
    clock = Clock()
    fired = clock.callLater(1, lambda: None)
    clock.advance(1)
    stop(fired)
    cancelled = clock.callLater(1, lambda: None)
    cancelled.cancel()
    stop(cancelled)
    stop(None)
    assert clock.getDelayedCalls() == []


def test_the_date_is_http_s_format_of_now() -> None:
    value = http_date()
    assert value.endswith(b" GMT") and http.stringToDatetime(value) > 0


def test_let_go_keeps_a_lent_deadline_s_timer_for_its_lender_and_stops_an_own_one() -> None:
    own, lent = Due(), Due()
    lent.deadline.lender = object()
    for d in (own, lent):
        d.deadline.set(10)
        d.deadline.let_go()
        assert d.deadline.due is None
    assert own.clock.getDelayedCalls() == [] and len(lent.clock.getDelayedCalls()) == 1
    lent.clock.advance(20)
    assert lent.passed == 0

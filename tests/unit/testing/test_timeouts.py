"""crossbar.testing.timeouts: a test that waits fails after its bound instead of hanging,
and says what it waited for. Driven here on a Clock standing in for the global reactor."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.testing import eventually, guard, turns
from crossbar.testing import timeouts as timeouts_module


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(timeouts_module, "global_reactor", lambda: clock)
    return clock


def failure_of(d: Deferred[Any]) -> BaseException:
    got: list[BaseException] = []
    d.addErrback(lambda f: got.append(f.value))
    assert got, "still waiting"
    return got[0]


def test_guard_gives_the_result_that_comes_in_time(clock: Clock) -> None:
    answer: Deferred[str] = Deferred()
    waited = Deferred.fromCoroutine(guard(answer, 5.0))
    clock.advance(4.9)
    answer.callback("ok")

    assert waited.result == "ok"
    assert not clock.getDelayedCalls()  # the bound is cancelled with it


def test_guard_fails_after_its_bound_and_names_what_it_waited_for(clock: Clock) -> None:
    answer: Deferred[str] = Deferred()
    waited = Deferred.fromCoroutine(guard(answer, 2.5, "first token"))
    clock.advance(2.4)
    assert not waited.called
    clock.advance(0.1)

    error = failure_of(waited)
    assert isinstance(error, AssertionError)
    assert str(error) == "no first token within 2.5s"


def test_eventually_returns_once_the_check_holds(clock: Clock) -> None:
    state = {"count": 0}
    waited = Deferred.fromCoroutine(eventually(lambda: state["count"] == 3, seconds=1.0))
    clock.advance(0.01)
    assert not waited.called
    state["count"] = 3
    clock.advance(0.01)

    assert waited.called
    assert waited.result is None


def test_eventually_fails_after_its_bound_naming_what_never_held(clock: Clock) -> None:
    waited = Deferred.fromCoroutine(eventually(lambda: False, seconds=0.5, what="3 requests"))
    clock.pump([0.01] * 49)
    assert not waited.called
    clock.pump([0.01] * 3)

    error = failure_of(waited)
    assert str(error) == "not true within 0.5s: 3 requests"


def test_turns_lets_the_reactor_run_n_times(clock: Clock) -> None:
    waited = Deferred.fromCoroutine(turns(3))
    clock.advance(0.001)
    clock.advance(0.001)
    assert not waited.called
    clock.advance(0.001)
    assert waited.called

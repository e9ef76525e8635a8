"""Shared fixtures: the running reactor, a Clock at the test module's ``T0``, and a check
that tests leave the reactor clean."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock, deferLater


@pytest.fixture
def reactor() -> Any:
    """The global reactor that pytest-twisted runs (it has no fixture of its own)."""
    from twisted.internet import reactor as _reactor

    return _reactor


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> Clock:
    """A Clock set to the test module's ``T0`` (0 without one): its windows and buckets
    start where the module's times say."""
    clock = Clock()
    clock.advance(getattr(request.module, "T0", 0.0))
    return clock


@pytest_twisted.async_yield_fixture(autouse=True)
async def _clean_reactor() -> AsyncIterator[None]:
    """Fail a test that leaves timers behind: they would fire inside a later test.

    A few reactor turns are allowed first, for connections that were closed at the
    end of the test to be noticed by the other side.
    """
    from twisted.internet import reactor as _reactor

    before = set(_reactor.getDelayedCalls())
    yield
    for _ in range(5):
        await deferLater(_reactor, 0.001, lambda: None)
    left = [call for call in _reactor.getDelayedCalls() if call not in before and call.active()]
    assert not left, f"test left delayed calls behind: {left}"

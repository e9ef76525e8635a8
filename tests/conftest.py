"""Shared fixtures: the running reactor, a Clock at the test module's ``T0``, and a check
that tests leave the reactor clean."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
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


def _uses_reactor(item: pytest.Item) -> bool:
    """Whether a test runs on the global reactor: it is in ``tests/system/`` or
    ``tests/integration/``, asks for the ``reactor`` fixture, or is a coroutine or
    ``inlineCallbacks`` test that pytest-twisted runs on it. Pure and in-memory tests
    (a ``Clock``, ``StringTransport``, ``MemoryProxy``) are none of these."""
    if not isinstance(item, pytest.Function):
        return False
    if {"system", "integration"} & set(item.path.parts):
        return True
    if "reactor" in item.fixturenames:
        return True
    function = item.obj
    return inspect.iscoroutinefunction(function) or hasattr(function, "__wrapped__")


@pytest.fixture(autouse=True)
def _clean_reactor(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test on the reactor that leaves timers behind: they would fire inside a
    later test.

    A few reactor turns are allowed first, for connections that were closed at the end of
    the test to be noticed by the other side. A test that does not use the reactor skips
    this: spinning it after every pure test cost about 10 ms a test.
    """
    if not _uses_reactor(request.node):
        yield
        return
    from twisted.internet import reactor as _reactor

    before = set(_reactor.getDelayedCalls())
    yield
    for _ in range(5):
        pytest_twisted.blockon(deferLater(_reactor, 0.001, lambda: None))
    left = [call for call in _reactor.getDelayedCalls() if call not in before and call.active()]
    assert not left, f"test left delayed calls behind: {left}"

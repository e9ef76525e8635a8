"""Shared fixtures: the running reactor, and a check that tests leave it clean."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def reactor() -> Any:
    """The global reactor that pytest-twisted runs (it has no fixture of its own)."""
    from twisted.internet import reactor as _reactor

    return _reactor


@pytest.fixture(autouse=True)
def _clean_reactor() -> Iterator[None]:
    """Fail a test that leaves timers behind: they would fire inside a later test."""
    from twisted.internet import reactor as _reactor

    before = set(_reactor.getDelayedCalls())
    yield
    left = [
        call
        for call in _reactor.getDelayedCalls()
        if call not in before and call.active() and "Clock" not in repr(call)
    ]
    for call in left:
        call.cancel()
    assert not left, f"test left delayed calls behind: {left}"

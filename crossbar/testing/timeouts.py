"""Bounded waits on the running reactor: a test that waits for something must fail, not hang.

They use the global reactor (the one pytest-twisted runs), imported only when called, so that
importing :mod:`crossbar.testing` never installs a reactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.task import deferLater

T = TypeVar("T")


def global_reactor() -> Any:
    """The reactor tests run on; imported late so the caller may install another first."""
    from twisted.internet import reactor

    return reactor


async def guard(d: Deferred[T], seconds: float, what: str = "answer") -> T:
    """Await ``d``, failing the test (not hanging it) after ``seconds``."""
    d.addTimeout(seconds, global_reactor())
    try:
        return await d
    except DeferredTimeout:
        raise AssertionError(f"no {what} within {seconds:g}s") from None


async def eventually(check: Callable[[], bool], seconds: float = 3.0, what: str = "") -> None:
    """Wait until ``check()`` holds, looking every 10 ms; fail after ``seconds``.

    For state that has no event of its own (counters); everything else awaits events.
    """
    reactor = global_reactor()
    deadline = reactor.seconds() + seconds
    while not check():
        if reactor.seconds() > deadline:
            raise AssertionError(f"not true within {seconds:g}s: {what or check}")
        await deferLater(reactor, 0.01, lambda: None)


async def turns(n: int = 5) -> None:
    """Let the reactor run a few times, for closes to reach the other side."""
    for _ in range(n):
        await deferLater(global_reactor(), 0.001, lambda: None)

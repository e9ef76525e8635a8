"""crossbar.usage.thread: blocking calls on one thread of their own, in order, their
results and errors back on the reactor's thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import deferLater

from crossbar.usage.thread import OneThread


@pytest_twisted.ensureDeferred
async def test_calls_run_in_order_off_the_reactor_thread(reactor: Any) -> None:
    worker = OneThread(reactor)
    seen: list[tuple[int, int]] = []

    def note(n: int) -> int:
        seen.append((n, threading.get_ident()))
        return n * 2

    results = [worker.run(note, n) for n in range(5)]
    assert [await result for result in results] == [0, 2, 4, 6, 8]
    assert [n for n, _ in seen] == [0, 1, 2, 3, 4]
    assert {ident for _, ident in seen} != {threading.get_ident()}
    assert len({ident for _, ident in seen}) == 1
    worker.stop()


@pytest_twisted.ensureDeferred
async def test_an_error_comes_back_as_a_failure(reactor: Any) -> None:
    worker = OneThread(reactor)
    with pytest.raises(ZeroDivisionError):
        await worker.run(lambda: 1 / 0)
    assert await worker.run(lambda: "still works") == "still works"
    worker.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        await worker.run(lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_stuck_call_holds_its_thread_not_the_reactor(reactor: Any) -> None:
    """While a call blocks, the reactor turns; the calls after it wait their turn."""
    worker = OneThread(reactor)
    started, release = threading.Event(), threading.Event()

    def hang() -> bool:
        started.set()
        return release.wait()

    stuck = worker.run(hang)
    after = worker.run(lambda: "after")
    assert started.wait(10)  # it runs, on its thread...
    await deferLater(reactor, 0, lambda: None)  # ...while the reactor turns
    assert not stuck.called and not after.called
    release.set()
    assert await stuck is True
    assert await after == "after"
    worker.stop()

"""crossbar._twisted.run_lean and dispatch_plainly: the epoll reactor's loop without a
log context around each event, and the start-up heap frozen out of the garbage
collector, on a reactor of its own (never the one the tests run on).

Each event must still reach its selectable, in the same turn, and an error that escapes
Twisted's own handling is logged naming the connection, while the other events of the
turn are still handled.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import epollreactor, selectreactor
from twisted.internet.abstract import FileDescriptor
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from crossbar._twisted import dispatch_plainly, run_lean


class Reader(FileDescriptor):
    """One end of a socket pair, registered for reading: what it read, and whether its
    ``connectionLost`` blows up (as a buggy protocol's would)."""

    def __init__(self, reactor: Any, sock: socket.socket, explode: bool = False) -> None:
        super().__init__(reactor)
        self.sock = sock
        self.read: list[bytes] = []
        self.explode = explode

    def fileno(self) -> int:
        return self.sock.fileno()

    def logPrefix(self) -> str:
        return "Reader,7,127.0.0.1"

    def doRead(self) -> Any:
        data = self.sock.recv(65536)
        self.read.append(data)
        return ValueError("a protocol error") if self.explode else None

    def connectionLost(self, reason: Failure) -> None:
        if self.explode:
            raise RuntimeError("connectionLost failed")


@pytest.fixture
def reactor() -> Iterator[Any]:
    made = epollreactor.EPollReactor()
    yield made
    made.removeAll()
    made._poller.close()


def pair(reactor: Any, explode: bool = False) -> tuple[Reader, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    reader = Reader(reactor, ours, explode)
    reactor.addReader(reader)
    return reader, theirs


def test_every_event_reaches_its_selectable_in_the_same_turn(reactor: Any) -> None:
    assert dispatch_plainly(reactor)
    first, one = pair(reactor)
    second, two = pair(reactor)
    one.send(b"hello")
    two.send(b"world")
    reactor.doIteration(0)
    assert (first.read, second.read) == ([b"hello"], [b"world"])
    reactor.doIteration(0)  # nothing more came: nothing more is read
    assert (first.read, second.read) == ([b"hello"], [b"world"])


def test_an_error_that_escapes_is_logged_by_connection_and_the_turn_goes_on(
    reactor: Any,
) -> None:
    assert dispatch_plainly(reactor)
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        broken, one = pair(reactor, explode=True)
        fine, two = pair(reactor)
        one.send(b"x")
        two.send(b"y")
        reactor.doIteration(0)
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert fine.read == [b"y"]
    failures = [e.get("log_failure") or e.get("failure") for e in events]
    escaped = [
        e for e, f in zip(events, failures, strict=True) if f is not None and f.check(RuntimeError)
    ]
    assert [e.get("log_system") or e.get("system") for e in escaped] == ["Reader,7,127.0.0.1"]
    assert broken not in reactor.getReaders()  # Twisted's own handling: disconnected


def test_another_reactor_is_left_alone() -> None:
    other = selectreactor.SelectReactor()
    try:
        assert not dispatch_plainly(other)
        assert "doIteration" not in vars(other)
    finally:
        other.removeAll()

    class Tuned(epollreactor.EPollReactor):
        def doPoll(self, timeout: float | None) -> None:  # a reactor that changed its loop
            super().doPoll(timeout)

        doIteration = doPoll

    tuned = Tuned()
    try:
        assert not dispatch_plainly(tuned)
    finally:
        tuned.removeAll()
        tuned._poller.close()


def test_run_lean_freezes_the_start_up_heap_when_the_reactor_runs(reactor: Any) -> None:
    run_lean(reactor)
    assert "doIteration" in vars(reactor)  # the plain loop
    frozen = gc.get_freeze_count()
    assert frozen == 0  # nothing yet: the heap is frozen once running, not when set up
    reactor.callWhenRunning(reactor.stop)
    try:
        reactor.run(installSignalHandlers=False)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # the test process's heap is its own again

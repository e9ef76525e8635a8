"""One thread of its own for blocking work (the usage store's SQLite calls), its results
handed back to the reactor as Deferreds.

One thread, so calls run one at a time and in order, and a SQLite connection is only
ever used by one thread at once. A daemon thread: a disk that hangs for good holds that
thread, never the reactor and never the process's exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorFromThreads
from twisted.python.failure import Failure

T = TypeVar("T")
_Call = tuple[Callable[..., Any], tuple[Any, ...], Deferred[Any]]


class Runner(Protocol):
    """Where blocking calls run: a :class:`OneThread` (in tests, often the test's own)."""

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]: ...

    def stop(self) -> None: ...


class OneThread:
    """Runs the functions given to :meth:`run` on its thread, started on first use."""

    def __init__(self, reactor: IReactorFromThreads, name: str = "crossbar-usage") -> None:
        self._reactor = reactor
        self._name = name
        self._calls: SimpleQueue[_Call | None] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self.stopped = False

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]:
        """``f(*args)`` on the thread; its result, or its exception as a failure (once
        stopped, a failure at once)."""
        if self.stopped:
            return fail(RuntimeError(f"{self._name}: stopped"))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        done: Deferred[T] = Deferred()
        self._calls.put((f, args, done))
        return done

    def stop(self) -> None:
        """Let the thread end once the calls given before are done (without waiting)."""
        self.stopped = True
        if self._thread is not None:
            self._calls.put(None)

    def _work(self) -> None:
        answer = self._reactor.callFromThread
        while (call := self._calls.get()) is not None:
            f, args, done = call
            try:
                result = f(*args)
            except BaseException:
                answer(done.errback, Failure())
            else:
                answer(done.callback, result)

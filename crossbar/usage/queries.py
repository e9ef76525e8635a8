"""The usage store's queries: read on a connection and a thread of their own, a few at
once, and stopped when their answer is no longer awaited.

A query over months of minutes can take seconds. On the writer's thread it would hold
every batch behind it; here it holds only other queries. At most ``most`` run or wait at
once: one more is refused at once (:class:`QueriesBusy`), not queued behind them. A
query whose Deferred is cancelled (the page's timeout) is told to stop: SQLite's progress
handler ends it within a few milliseconds of work, and its place is free again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from crossbar.usage.store import UsageStore
from crossbar.usage.thread import Runner

MOST_QUERIES = 2
"""Queries running or waiting at once; one more is refused."""

Rows = list[dict[str, Any]]


class QueriesBusy(Exception):
    """Refused: ``most`` queries are already running or waiting."""

    def __init__(self, most: int) -> None:
        super().__init__(f"{most} usage queries are already running; try again when they end")
        self.most = most


class _Stop:
    """Whether one query is to stop: set from the reactor's thread, read on the query's."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self) -> bool:
        return self.asked


class UsageQueries:
    """Runs ``store``'s queries on ``thread``: a reading store and a thread apart from the
    ledger's (a ``":memory:"`` store has no second connection: then the ledger's own)."""

    def __init__(self, store: UsageStore, thread: Runner, *, most: int = MOST_QUERIES) -> None:
        self.store, self.most = store, most
        self._thread = thread
        self.running = 0
        """Queries given to the thread and not yet ended there (a stopped one too)."""

    def query(
        self, since: float, until: float, by: Sequence[str], *, capped: bool = True
    ) -> Deferred[Rows]:
        """The sums over ``[since, until)`` by ``by``; a failure with
        :class:`QueriesBusy` when ``most`` are running and the query is ``capped`` (one
        asked from outside; crossbar's own few reads, the status page's, never are).
        Cancelling the answer stops the query on its thread."""
        if capped and self.running >= self.most:
            return fail(QueriesBusy(self.most))
        stop = _Stop()

        def cancel(_: Deferred[Rows]) -> None:
            stop.asked = True

        answer: Deferred[Rows] = Deferred(cancel)
        self.running += 1
        running = self._thread.run(self._read, since, until, tuple(by), stop)

        def ended(result: Rows | Failure) -> None:
            self.running -= 1
            if answer.called:  # cancelled: no one awaits it (a stopped query's error too)
                return
            if isinstance(result, Failure):
                answer.errback(result)
            else:
                answer.callback(result)

        running.addBoth(ended)
        return answer

    def refused(self, since: float, until: float) -> Deferred[Rows]:
        """The requests not served over ``[since, until)``, by route, key and why: a few
        rows a minute at most, read on the same thread, never refused as busy."""
        return self._thread.run(self._read_refused, since, until)

    def _read_refused(self, since: float, until: float) -> Rows:
        if not self.store.opened:
            self.store.open()
        return self.store.refused(since, until)

    def _read(self, since: float, until: float, by: tuple[str, ...], stop: _Stop) -> Rows:
        """On the thread: open the reading connection the first time, then query."""
        if not self.store.opened:
            self.store.open()
        return self.store.query(since, until, by, stop)

    def stop(self) -> None:
        """Close the reading connection once the queries given before are done."""
        if self.store.reading:
            self._thread.run(self.store.close).addErrback(lambda _: None)
            self._thread.stop()

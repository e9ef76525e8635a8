"""crossbar.usage.queries: the usage page's queries read on a connection and a thread of
their own, a few at once, and a query whose answer timed out is stopped where it is.

A slow query is played by a reading store that stops at one of SQLite's progress checks
until the test lets it go: no sleeps, and the checks counted say where it ended."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.web.test.requesthelper import DummyRequest

from crossbar.pages.usagequery import QUERY_SECONDS, answer
from crossbar.stats.record import RequestRecord
from crossbar.testing.timeouts import guard
from crossbar.usage.ledger import UsageLedger
from crossbar.usage.queries import UsageQueries
from crossbar.usage.store import UsageStore
from crossbar.usage.thread import OneThread

ROW = [1, 0, 100, 60, 20, 1, 0.5, 1, 40.0, 0]
KEYS = 40
MINUTES = 500
"""20,000 rows: a query by key walks them in some tens of progress checks."""
USED = RequestRecord("lab", "gpu-a", 200, 1.0, model="m", key="carol", prompt_tokens=7)


class Held(UsageStore):
    """A reading store whose queries stop at their ``at``-th progress check until
    :attr:`go` is set; :attr:`checks` counts the checks of the last query."""

    def __init__(self, path: str, at: int) -> None:
        super().__init__(path, reading=True)
        self.at, self.checks = at, 0
        self.midway, self.go = threading.Event(), threading.Event()

    def query(
        self, since: float, until: float, by: Sequence[str], stop: Callable[[], bool] = bool
    ) -> list[dict[str, Any]]:
        self.checks = 0

        def check() -> bool:
            self.checks += 1
            if self.checks == self.at:
                self.midway.set()
                self.go.wait(10)
            return stop()

        return super().query(since, until, by, check)


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[UsageStore]:
    """The writer's store, with :data:`MINUTES` minutes of :data:`KEYS` keys."""
    writer = UsageStore(str(tmp_path / "u.sqlite3"))
    writer.open()
    places = [
        (m * 60, "lab", "a", "m", f"key-{k}", "") for m in range(MINUTES) for k in range(KEYS)
    ]
    writer.add(dict.fromkeys(places, ROW))
    yield writer
    writer.close()


def ledger_with(writer: UsageStore, reading: UsageStore, reactor: Any, **kw: Any) -> UsageLedger:
    queries = UsageQueries(reading, OneThread(reactor, "test-read"), **kw)
    clock = Clock()
    clock.advance(MINUTES * 60)
    return UsageLedger(writer, 1e9, clock, OneThread(reactor), lambda m: True, queries=queries)


def test_a_query_checks_whether_to_stop_as_it_goes(filled: UsageStore) -> None:
    checks: list[int] = []
    rows = filled.query(0, MINUTES * 60, ["key"], lambda: checks.append(1) or False)
    assert len(rows) == KEYS and len(checks) > 10
    with pytest.raises(Exception, match="interrupted"):
        filled.query(0, MINUTES * 60, ["key"], lambda: True)


@pytest_twisted.ensureDeferred
async def test_a_write_is_not_held_behind_a_slow_query(filled: UsageStore, reactor: Any) -> None:
    held = Held(filled.path, at=2)
    ledger = ledger_with(filled, held, reactor)
    asked = ledger.query(0, MINUTES * 60, ["key"])
    assert await deferToThread(held.midway.wait, 10)  # the query is half-way
    ledger.request_done(USED)
    await guard(ledger.flush(), 5)  # written while the query is held
    assert [r["key"] for r in filled.query(MINUTES * 60, 1e10, ["key"])] == ["carol"]
    held.go.set()
    rows = await guard(asked, 10)
    assert len(rows) == KEYS and held.checks > 2  # it ran to its end
    ledger.queries.stop()


@pytest_twisted.ensureDeferred
async def test_a_query_whose_answer_timed_out_is_stopped_where_it_is(
    filled: UsageStore, reactor: Any
) -> None:
    held = Held(filled.path, at=2)
    thread = OneThread(reactor, "test-read")
    queries = UsageQueries(held, thread)
    clock = Clock()
    asked = queries.query(0, MINUTES * 60, ["key"]).addTimeout(QUERY_SECONDS, clock)
    assert await deferToThread(held.midway.wait, 10)
    clock.advance(QUERY_SECONDS)
    with pytest.raises(TimeoutError):
        await asked
    assert queries.running == 1  # still on its thread
    held.go.set()
    await guard(thread.run(lambda: None), 10)  # the thread has ended it
    assert held.checks == 2  # stopped at the check it was at when its answer timed out
    assert queries.running == 0
    full = await guard(queries.query(0, MINUTES * 60, ["key"]), 10)  # held.go is set
    assert len(full) == KEYS and held.checks > 10
    queries.stop()


@pytest_twisted.ensureDeferred
async def test_past_two_queries_at_once_the_page_says_busy(
    filled: UsageStore, reactor: Any
) -> None:
    held = Held(filled.path, at=1)
    ledger = ledger_with(filled, held, reactor)
    first = ledger.query(0, MINUTES * 60, ["key"])
    second = ledger.query(0, MINUTES * 60, ["model"])  # waits behind the first
    clock, request = Clock(), DummyRequest([b"usage"])
    clock.advance(MINUTES * 60)
    answered = Deferred.fromCoroutine(answer(request, ledger, clock))
    assert answered.called and request.responseCode == 503
    assert json.loads(answered.result) == {
        "error": "usage queries busy",
        "reason": "2 usage queries are already running; try again when they end",
    }
    assert request.responseHeaders.getRawHeaders(b"retry-after") == [b"5"]
    held.go.set()
    assert len(await guard(first, 10)) == KEYS and len(await guard(second, 10)) == 1
    assert len(await guard(ledger.query(0, MINUTES * 60, ["key"]), 10)) == KEYS
    ledger.queries.stop()

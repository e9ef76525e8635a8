"""crossbar.usage.ledger: requests summed in memory, written a batch at a time on the
store's thread, kept while the store cannot take them, written at stop; a store that
cannot be used is one line and nothing more."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.task import Clock

from crossbar.stats.record import RequestRecord
from crossbar.testing.logs import LogCapture
from crossbar.usage.ledger import (
    FLUSH_SECONDS,
    PRUNE_SECONDS,
    STOP_SECONDS,
    STUCK_SECONDS,
    UsageLedger,
)
from crossbar.usage.store import UsageStore
from crossbar.usage.thread import OneThread
from tests.support.usagerows import kept

T = TypeVar("T")


USED = RequestRecord(
    "lab", "gpu-a", 200, 1.0, model="m", key="alice", prompt_tokens=100, cached_tokens=60,
    generated_tokens=20, first_token=0.5, tokens_per_second=40.0,
)  # fmt: skip


class Inline:
    """The store's calls at once, on the test's thread; ``held`` keeps them until
    :meth:`release`, as a disk that hangs would."""

    def __init__(self) -> None:
        self.held = False
        self.waiting: list[tuple[Callable[[], Any], Deferred[Any]]] = []
        self.stopped = False

    def run(self, f: Callable[..., T], *args: Any) -> Deferred[T]:
        if not self.held:
            return maybeDeferred(f, *args)
        done: Deferred[T] = Deferred()
        self.waiting.append((lambda: f(*args), done))
        return done

    def release(self) -> None:
        self.held = False
        while self.waiting:
            call, done = self.waiting.pop(0)
            maybeDeferred(call).chainDeferred(done)

    def stop(self) -> None:
        self.stopped = True


class Failing(UsageStore):
    """A store whose writes fail while ``failing``."""

    failing = True

    def add(self, rows: Any, refused: Any = None) -> None:
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        super().add(rows, refused or {})


def started(store: UsageStore, most: int = 20_000) -> tuple[UsageLedger, Clock, Inline]:
    clock, thread = Clock(), Inline()
    clock.advance(1_000_000)
    ledger = UsageLedger(store, 90 * 86400.0, clock, thread, lambda m: m == "m", most=most)
    ledger.startService()
    return ledger, clock, thread


def test_requests_are_written_a_batch_every_few_seconds() -> None:
    store = UsageStore(":memory:")
    ledger, clock, _ = started(store)
    for _ in range(3):
        ledger.request_done(USED)
    assert kept(store) == []  # not yet: in memory
    clock.advance(FLUSH_SECONDS)
    [row] = kept(store, ("key",))
    assert (row["key"], row["requests"], row["prompt_tokens"], row["cached_tokens"]) == (
        "alice", 3, 300, 180,
    )  # fmt: skip
    assert not ledger.sums
    ledger.request_done(USED)
    clock.advance(FLUSH_SECONDS)
    assert kept(store)[0]["completion_tokens"] == 80
    ledger.stopService()


def test_a_batch_that_cannot_be_written_waits_and_is_written_once_later() -> None:
    store = Failing(":memory:")
    logs = LogCapture()
    try:
        ledger, clock, _ = started(store)
        ledger.request_done(USED)
        clock.advance(FLUSH_SECONDS)
        ledger.request_done(USED)
        clock.advance(FLUSH_SECONDS)  # fails again: said once
        store.failing = False
        clock.advance(FLUSH_SECONDS)
    finally:
        logs.close()
    assert kept(store)[0]["requests"] == 2  # both, once each
    [trouble] = logs.matching("usage store: cannot write :memory:: disk I/O error")
    assert "at most 20000 rows" in trouble
    assert logs.matching("usage store: :memory: works again") == [
        "usage store: :memory: works again"
    ]
    ledger.stopService()


def test_what_waits_in_memory_is_bounded_and_what_was_left_out_is_said() -> None:
    store = Failing(":memory:")
    logs = LogCapture()
    try:
        ledger, clock, _ = started(store, most=2)
        for _ in range(5):
            ledger.request_done(USED)
            clock.advance(60)
        assert len(ledger.sums) == 2
        store.failing = False
        clock.advance(FLUSH_SECONDS)
    finally:
        logs.close()
    assert kept(store)[0]["requests"] == 2
    assert logs.matching("works again; the usage of 3 requests was left out meanwhile")
    ledger.stopService()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: (d.joinpath("u").write_bytes(b"garbage" * 1000), d / "u")[1],
         "file is not a database"),
        (lambda d: d / "no-such-folder" / "u.sqlite3", "unable to open database file"),
    ],
    ids=["corrupt", "unwritable"],
)  # fmt: skip
def test_a_store_that_cannot_be_used_is_one_line_and_requests_go_on(
    tmp_path: Path, make: Callable[[Path], Path], why: str
) -> None:
    path = make(tmp_path)
    logs = LogCapture()
    try:
        ledger, clock, _ = started(UsageStore(str(path)))
        for _ in range(3):
            ledger.request_done(USED)
            clock.advance(FLUSH_SECONDS)
        ledger.stopService()
    finally:
        logs.close()
    assert ledger.off == f"cannot use {path}: {why}"
    assert logs.lines == [f"usage store off, crossbar serves without it: cannot use {path}: {why}"]
    assert not ledger.sums


def test_a_stop_writes_the_last_batch_so_a_restart_loses_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "u.sqlite3")
    ledger, clock, thread = started(UsageStore(path))
    ledger.request_done(USED)
    clock.advance(FLUSH_SECONDS)
    ledger.request_done(USED)  # not yet written when the stop comes
    stopped = ledger.stopService()
    assert stopped.called and thread.stopped
    again = UsageStore(path)
    again.open()
    assert kept(again)[0]["requests"] == 2


def test_a_stop_with_a_write_stuck_gives_up_after_a_while_and_says_what_is_lost() -> None:
    store = UsageStore(":memory:")
    logs = LogCapture()
    try:
        ledger, clock, thread = started(store)
        ledger.request_done(USED)
        thread.held = True
        clock.advance(FLUSH_SECONDS)  # the write hangs
        ledger.request_done(USED)
        stopped = ledger.stopService()
        assert not stopped.called
        clock.advance(STOP_SECONDS)
        assert stopped.called and thread.stopped
    finally:
        logs.close()
    assert logs.matching("the last batch was not written in 5 s; the usage of 1 requests is lost")


def test_old_usage_is_pruned_at_start_and_every_hour() -> None:
    store = UsageStore(":memory:")
    store.open()
    store.add({(0, "lab", "gpu-a", "m", "alice", ""): [1, 0, 1, 0, 1, 0, 0.0, 0, 0.0, 0]})
    clock, thread = Clock(), Inline()
    retention = 3 * 3600.0
    clock.advance(retention + 60 * 60)  # the row at 0 is one hour too old
    ledger = UsageLedger(store, retention, clock, thread, lambda m: True)
    store.open = lambda: None  # type: ignore[method-assign]  # opened above, rows in it
    ledger.startService()
    assert kept(store) == []
    store.add({(int(clock.seconds() - retention + 60), "lab", "gpu-a", "m", "a", ""): [1] * 10})
    clock.advance(PRUNE_SECONDS)
    assert kept(store) == []
    ledger.stopService()


def test_a_prune_that_fails_is_one_line_and_tried_again_in_an_hour() -> None:
    class NoPrune(UsageStore):
        failing = True

        def prune(self, before: float) -> int:
            if self.failing:
                raise sqlite3.OperationalError("database is locked")
            return super().prune(before)

    store = NoPrune(":memory:")
    logs = LogCapture()
    try:
        ledger, clock, _ = started(store)
        clock.advance(PRUNE_SECONDS)
        store.failing = False
        clock.advance(PRUNE_SECONDS)
        ledger.stopService()
    finally:
        logs.close()
    assert logs.lines == [
        "usage store: cannot prune :memory:: database is locked; tried again in an hour",
        "usage store: :memory: works again",
    ]


def test_a_write_that_hangs_is_said_once_and_requests_wait_in_memory() -> None:
    store = UsageStore(":memory:")
    logs = LogCapture()
    try:
        ledger, clock, thread = started(store)
        thread.held = True
        ledger.request_done(USED)
        clock.advance(FLUSH_SECONDS)  # the write hangs from here
        for _ in range(int(STUCK_SECONDS / FLUSH_SECONDS) + 3):
            ledger.request_done(USED)
            clock.advance(FLUSH_SECONDS)
        thread.release()
        clock.advance(FLUSH_SECONDS)
        assert kept(store)[0]["requests"] == int(STUCK_SECONDS / FLUSH_SECONDS) + 4
        ledger.stopService()
    finally:
        logs.close()
    assert logs.lines == [
        "usage store: cannot write :memory:: no answer in 60 s; usage waits in memory (at most"
        " 20000 rows, a minute of a route, host, model and key each) to be written with a"
        " later batch",
        "usage store: :memory: works again",
    ]


# -- within crossbar ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_two_workers_ledgers_on_one_file_sum_each_others_requests(
    tmp_path: Path, reactor: Any
) -> None:
    """``workers: N``: each worker's ledger, on its own thread and connection, writes the
    same minute of the same route, host, model and key; the file holds their sum."""
    path = str(tmp_path / "u.sqlite3")
    ledgers = [
        UsageLedger(UsageStore(path), 86400.0, reactor, OneThread(reactor), lambda m: True)
        for _ in range(2)
    ]
    for ledger in ledgers:
        ledger.startService()
    for n, ledger in enumerate(ledgers, start=1):
        for _ in range(n):
            ledger.request_done(USED)
    await gatherResults([ledger.flush() for ledger in ledgers])
    [row] = await ledgers[0].query(0, 10**10, ())  # both minutes, should the minute turn
    assert (row["requests"], row["prompt_tokens"]) == (3, 300)
    for ledger in ledgers:
        await ledger.stopService()

"""The public helpers of crossbar.testing that other tests only use in passing, in memory:
the simulator names, the streaming reader, the log capture and the bounded waits.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionLost
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

import crossbar.testing
import crossbar.testing.simulator
from crossbar.polling.health import HealthTable
from crossbar.testing import (
    FAST,
    LogCapture,
    Reader,
    all_polled,
    broken,
    eventually,
    fast,
    guard,
    turns,
)

# -- the package --------------------------------------------------------------------------------


def test_simulator_names_are_the_same_from_both_places() -> None:
    for name in ("BUILD_INFO", "Fault", "RecordedRequest", "SimulatedHost"):
        assert getattr(crossbar.testing.simulator, name) is getattr(crossbar.testing, name)
    assert set(crossbar.testing.simulator.__all__) <= set(crossbar.testing.__all__)


# -- bounded waits ------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_guard_gives_the_result_or_fails_after_the_time(reactor: Any) -> None:
    d: Deferred[str] = Deferred()
    reactor.callLater(0, d.callback, "ok")
    assert await guard(d, 1.0) == "ok"
    with pytest.raises(AssertionError, match=r"^no reply within 0\.05s$"):
        await guard(Deferred(), 0.05, "reply")


@pytest_twisted.ensureDeferred
async def test_eventually_waits_for_the_check_or_fails_naming_it(reactor: Any) -> None:
    flag: list[int] = []
    reactor.callLater(0.03, flag.append, 1)
    await eventually(lambda: bool(flag), seconds=1.0)
    assert flag == [1]
    with pytest.raises(AssertionError, match=r"not true within 0\.05s: never"):
        await eventually(lambda: False, seconds=0.05, what="never")


@pytest_twisted.ensureDeferred
async def test_turns_let_the_reactor_run(reactor: Any) -> None:
    ran: list[int] = []
    reactor.callLater(0, ran.append, 1)
    await turns(1)
    assert ran == [1]


# -- log capture --------------------------------------------------------------------------------


def test_log_capture_sees_formatted_lines_until_closed() -> None:
    log = Logger(namespace="test")
    logs = LogCapture()
    try:
        log.info("host {name} is up", name="gpu-a")
        log.info("host {name} is down", name="gpu-b")
        assert "host gpu-a is up" in logs.lines
        assert logs.matching("host", "down") == ["host gpu-b is down"]
        assert logs.matching("gpu-a", "down") == []
    finally:
        logs.close()
    log.info("after the close")
    assert not logs.matching("after the close")


# -- the streaming reader -----------------------------------------------------------------------


class FakeTransport:
    stopped = False

    def stopProducing(self) -> None:
        self.stopped = True


@pytest_twisted.ensureDeferred
async def test_reader_fires_on_enough_bytes_and_tells_a_clean_end() -> None:
    reader = Reader()
    first, later = reader.bytes(2), reader.bytes(5)
    reader.dataReceived(b"ab")
    assert first.called and not later.called
    reader.dataReceived(b"cde")
    assert await later == b"abcde"
    assert await reader.bytes(1) == b"abcde"  # already there: fires at once
    reader.connectionLost(Failure(ResponseDone()))
    assert not broken(await reader.end(seconds=1.0))


@pytest_twisted.ensureDeferred
async def test_reader_fails_the_waits_of_a_broken_body() -> None:
    reader = Reader()
    pending = reader.bytes(10)
    reader.dataReceived(b"abc")
    reader.connectionLost(Failure(ConnectionLost()))
    with pytest.raises(ConnectionLost):
        await pending
    assert broken(await reader.end(seconds=1.0))
    assert reader.data == b"abc"


@pytest_twisted.ensureDeferred
async def test_reader_end_is_bounded_and_hang_up_stops_the_transport() -> None:
    reader = Reader()
    transport = FakeTransport()
    reader.makeConnection(transport)
    reader.hang_up()
    assert transport.stopped
    with pytest.raises(AssertionError, match="no end of the answer within"):
        await reader.end(seconds=0.05)


def test_potential_data_loss_is_not_broken() -> None:
    """A body without a length that ends with the connection is complete as far as we know."""
    assert not broken(Failure(PotentialDataLoss()))


# -- settings -----------------------------------------------------------------------------------


def test_fast_changes_only_what_it_is_told() -> None:
    settings = fast(poll_timeout=3.0)
    assert settings.poll_timeout == 3.0
    assert settings.poll_interval == FAST.poll_interval == 60.0
    assert FAST.poll_timeout == 1.0
    with pytest.raises(TypeError):
        fast(no_such_setting=1)


# -- the rig ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_all_polled_waits_for_every_first_poll(reactor: Any) -> None:
    table = HealthTable({"a": "http://a", "b": "http://b"}, reactor)
    reactor.callLater(0.01, table.record_ok, "a", ["m"], ["m"])
    with pytest.raises(AssertionError, match="no every host's first poll within"):
        await all_polled(table, seconds=0.05)
    reactor.callLater(0.01, table.record_failure, "b", "refused")
    await all_polled(table, seconds=1.0)
    assert {s.state for s in table.snapshot().values()} == {"up", "down"}

"""The public helpers of crossbar.testing that other tests only use in passing: the rig, the
streaming reader, the log capture and the bounded waits."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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
    SimulatedHost,
    all_polled,
    broken,
    eventually,
    fast,
    guard,
    rigs,
    turns,
    wait_state,
)

CHAT = "/lab/v1/chat/completions"


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# -- the package --------------------------------------------------------------------------------


def test_importing_installs_no_reactor() -> None:
    """Programs must be able to pick their reactor after importing the test doubles."""
    code = "import sys, crossbar.testing; print('twisted.internet.reactor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
async def test_rig_answers_through_crossbar_and_is_torn_down() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"}, chunks=3)
    async with rigs() as make:
        rig = await make({"gpu-a": sim, "gpu-b": "http://127.0.0.1:1"}, up=("gpu-a",))
        assert rig.base == f"http://127.0.0.1:{rig.port}"
        assert set(rig.sims) == {"gpu-a"}
        assert rig.state("gpu-a").healthy
        assert rig.state("gpu-b").url == "http://127.0.0.1:1"
        with pytest.raises(AssertionError):
            rig.state("nope")
        assert rig.logs.matching("host gpu-a is up")

        response, body = await rig.post(CHAT, {"model": "tiny-a", "messages": []})
        assert response.code == 200
        assert json.loads(body)["choices"][0]["message"]["content"] == "abc"
        response, body = await rig.get("/lab/v1/models")
        assert response.code == 200

        response, reader = await rig.stream(CHAT, {"model": "tiny-a", "stream": True})
        assert response.code == 200
        assert not broken(await reader.end())
        assert reader.data.endswith(b"data: [DONE]\n\n")
        assert [json.loads(b).get("stream") for b in rig.completions("gpu-a")] == [None, True]
        sim_port, crossbar_port = int(sim.url.rsplit(":", 1)[1]), rig.port
    assert sim.open_connections == 0
    assert refused(sim_port) and refused(crossbar_port)
    Logger(namespace="test").info("after the teardown")
    assert not rig.logs.matching("after the teardown")


@pytest_twisted.ensureDeferred
async def test_wait_state_waits_for_the_change_or_fails_naming_it() -> None:
    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost()})
        await wait_state(rig, "gpu-a", healthy=True, seconds=0.05)  # already true
        rig.crossbar.table.mark_down("gpu-a", "test")
        await wait_state(rig, "gpu-a", healthy=False, seconds=1.0)
        with pytest.raises(AssertionError, match=r"no gpu-a up within 0\.05s"):
            await wait_state(rig, "gpu-a", healthy=True, seconds=0.05)


@pytest_twisted.ensureDeferred
async def test_all_polled_waits_for_every_first_poll(reactor: Any) -> None:
    table = HealthTable({"a": "http://a", "b": "http://b"}, reactor)
    reactor.callLater(0.01, table.record_ok, "a", ["m"], ["m"])
    with pytest.raises(AssertionError, match="no every host's first poll within"):
        await all_polled(table, seconds=0.05)
    reactor.callLater(0.01, table.record_failure, "b", "refused")
    await all_polled(table, seconds=1.0)
    assert {s.state for s in table.snapshot().values()} == {"up", "down"}

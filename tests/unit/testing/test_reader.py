"""crossbar.testing.reader: a client that sees an answer's body as it streams, waits for the
first bytes, tells a broken stream from a whole one, and can leave mid-way."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss

from crossbar.testing import Reader, broken
from crossbar.testing import timeouts as timeouts_module


def test_bytes_fires_once_enough_has_arrived() -> None:
    reader = Reader()
    first, more = reader.bytes(1), reader.bytes(10)
    reader.dataReceived(b"data: ")
    assert first.result == b"data: "
    assert not more.called
    reader.dataReceived(b"{}\n\n")
    assert more.result == b"data: {}\n\n"
    assert reader.bytes(3).result == b"data: {}\n\n"  # already there


def test_the_end_says_why_and_fails_whoever_still_waits() -> None:
    reader = Reader()
    reader.dataReceived(b"data: {}")
    waiting = reader.bytes(100)
    failures: list[Failure] = []
    waiting.addErrback(failures.append)

    reader.connectionLost(Failure(ResponseFailed([Failure(ConnectionLost())])))

    assert reader.ended.called
    assert failures and failures[0].check(ResponseFailed)
    assert broken(reader.reason)  # type: ignore[arg-type]


def test_a_whole_body_is_not_broken() -> None:
    assert not broken(Failure(ResponseDone()))
    assert not broken(Failure(PotentialDataLoss()))
    assert broken(Failure(ResponseFailed([Failure(ConnectionLost())])))


def test_end_awaits_the_reason_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(timeouts_module, "global_reactor", lambda: clock)
    reader = Reader()
    ending = Deferred.fromCoroutine(reader.end(seconds=1.0))
    reader.connectionLost(Failure(ResponseDone()))
    assert ending.result.check(ResponseDone)

    never = Reader()
    waited = Deferred.fromCoroutine(never.end(seconds=1.0))
    clock.advance(1.0)
    errors: list[Any] = []
    waited.addErrback(lambda f: errors.append(f.value))
    assert str(errors[0]) == "no end of the answer within 1s"


def test_hang_up_stops_the_transport_as_a_leaving_client_does() -> None:
    reader = Reader()
    transport = StringTransport()
    reader.makeConnection(transport)
    reader.hang_up()
    assert transport.producerState == "stopped"

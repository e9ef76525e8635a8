"""crossbar.upstream.connection: one kept-alive connection to a host over a StringTransport.
It sends a request, hands the answer's head to the caller and its body to a reader as it
comes, goes back to its pool only when the answer is whole and the host keeps it open, and
is dropped whenever it is out of step with the host. The same over real sockets is in
tests/system/test_upstream.py."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.error import ConnectionLost
from twisted.internet.protocol import Protocol
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss

from crossbar.upstream.connection import (
    IDLE,
    MAX_PHRASE,
    Connection,
    ConnectionFactory,
    Response,
    shown_phrase,
)
from crossbar.upstream.parsing import BadAnswer

REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gpu-a\r\nContent-Length: 2\r\n\r\n", b"{}")
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"


class Pool:
    def __init__(self) -> None:
        self.released: list[Connection] = []
        self.forgotten: list[Connection] = []

    def release(self, connection: Connection) -> None:
        self.released.append(connection)

    def forget(self, connection: Connection) -> None:
        self.forgotten.append(connection)


class Waiter:
    def __init__(self) -> None:
        self.response: Response | None = None
        self.failed: Failure | None = None
        self.lost_with: tuple[Failure, bool] | None = None

    def answered(self, response: Response) -> None:
        self.response = response

    def fail(self, reason: Failure) -> None:
        self.failed = reason

    def lost(self, connection: Connection, reason: Failure, got_bytes: bool) -> None:
        self.lost_with = (reason, got_bytes)


class Body(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.reason: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self.reason = reason


class Line:
    """A connection on a StringTransport, its pool, and what it was asked."""

    def __init__(self) -> None:
        self.pool = Pool()
        self.transport = StringTransport()
        self.connection = ConnectionFactory(self.pool, "gpu-a").buildProtocol(None)
        self.connection.makeConnection(self.transport)
        self.waiter = Waiter()

    def ask(self, head_only: bool = False) -> None:
        self.waiter = Waiter()
        self.transport.clear()
        self.connection.send(self.waiter, REQUEST, head_only)

    def answer(self, data: bytes) -> None:
        self.connection.dataReceived(data)

    def close(self, reason: Failure | None = None) -> None:
        self.connection.connectionLost(reason or Failure(ConnectionLost()))

    @property
    def response(self) -> Response:
        assert self.waiter.response is not None, "no head yet"
        return self.waiter.response

    def body(self) -> Body:
        body = Body()
        self.response.deliverBody(body)
        return body


@pytest.fixture
def line() -> Line:
    return Line()


def test_the_request_goes_out_whole_and_the_answer_comes_back(line: Line) -> None:
    line.ask()
    assert line.transport.value() == b"".join(REQUEST)

    line.answer(OK + b'{"ok":tru')
    assert line.response.code == 200
    assert line.response.phrase == b"OK"
    assert line.response.headers == [
        (b"Content-Type", b"application/json"),
        (b"Content-Length", b"11"),
    ]
    assert line.response.length == 11
    body = line.body()
    assert body.data == b'{"ok":tru'  # what came before the reader, held for it
    assert body.reason is None

    line.answer(b"e}")
    assert body.data == b'{"ok":true}'
    assert body.reason is not None and body.reason.check(ResponseDone)
    assert line.pool.released == [line.connection]
    assert line.connection.state == IDLE


def test_a_kept_connection_answers_the_next_request_too(line: Line) -> None:
    line.ask()
    line.answer(OK + b'{"ok":true}')
    first = line.body()
    line.ask()
    line.answer(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}")

    assert line.response.code == 201
    assert line.body().data == b"{}"
    assert first.data == b'{"ok":true}'
    assert line.pool.released == [line.connection, line.connection]


def test_a_host_that_closes_after_its_answer_is_not_pooled(line: Line) -> None:
    line.ask()
    line.answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
    body = line.body()

    assert body.reason is not None and body.reason.check(ResponseDone)
    assert line.pool.released == []
    assert line.transport.disconnecting and not line.transport.disconnected  # closed, not aborted


def test_without_a_length_the_end_of_the_connection_ends_the_body(line: Line) -> None:
    line.ask()
    line.answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: {}\n\n")
    body = line.body()
    line.close()

    assert body.data == b"data: {}\n\n"
    assert body.reason is not None and body.reason.check(PotentialDataLoss)
    assert line.pool.forgotten == [line.connection]


def test_a_body_cut_off_by_the_host_fails(line: Line) -> None:
    line.ask()
    line.answer(OK + b'{"ok"')
    body = line.body()
    line.close()

    assert body.reason is not None and body.reason.check(ResponseFailed)
    assert line.pool.released == []


def test_an_answer_that_cannot_be_framed_fails_the_request(line: Line) -> None:
    line.ask()
    line.answer(b"SPDY/3 200 OK\r\n\r\n")

    assert line.waiter.failed is not None
    assert line.waiter.failed.check(ResponseFailed)
    assert line.waiter.failed.value.reasons[0].check(BadAnswer)
    assert line.transport.disconnected  # aborted


def test_the_host_leaving_before_the_head_is_told_with_whether_it_said_anything(
    line: Line,
) -> None:
    line.ask()
    line.answer(b"HTTP/1.1 2")
    line.close()

    assert line.waiter.lost_with is not None
    reason, got_bytes = line.waiter.lost_with
    assert reason.check(ConnectionLost) and got_bytes
    assert line.pool.forgotten == [line.connection]


def test_a_host_that_speaks_unasked_is_dropped(line: Line) -> None:
    line.ask()
    line.answer(OK + b'{"ok":true}')
    assert not line.transport.disconnecting
    line.answer(b"HTTP/1.1 200 OK\r\n")  # nothing was asked
    assert line.transport.disconnected  # aborted


def test_bytes_after_the_answer_drop_the_connection(line: Line) -> None:
    line.ask()
    line.answer(OK + b'{"ok":true}HTTP/1.1 200 OK\r\n')
    body = line.body()

    assert body.reason is not None and body.reason.check(ResponseDone)
    assert line.pool.released == []
    assert line.transport.disconnected  # aborted


def test_a_head_request_ends_at_its_head(line: Line) -> None:
    line.ask(head_only=True)
    line.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    body = line.body()

    assert body.reason is not None and body.reason.check(ResponseDone)
    assert line.pool.released == [line.connection]


def test_a_slow_reader_pauses_the_host_and_a_leaving_one_drops_the_connection(
    line: Line,
) -> None:
    line.ask()
    line.answer(OK + b"{")
    body = line.body()
    control: Any = body.transport

    control.pauseProducing()
    assert line.transport.producerState == "paused"
    control.resumeProducing()
    assert line.transport.producerState == "producing"
    control.stopProducing()
    assert line.transport.disconnected  # aborted
    line.answer(b'"ok"')
    assert body.data == b"{"  # nothing after it left


def test_a_reader_of_an_ended_body_cannot_touch_the_next_answer(line: Line) -> None:
    line.ask()
    line.answer(OK + b'{"ok":true}')
    old: Any = line.body().transport
    line.ask()
    line.answer(OK + b'{"ok"')
    old.pauseProducing()
    old.stopProducing()

    assert line.transport.producerState == "producing"
    assert not line.transport.disconnecting


def test_a_caller_that_gives_up_drops_the_connection_and_hears_nothing(line: Line) -> None:
    line.ask()
    line.connection.cancel()
    line.close()

    assert line.transport.disconnected  # aborted
    assert line.waiter.lost_with is None


def test_closing_an_idle_connection_fires_once_it_is_closed(line: Line) -> None:
    closed = line.connection.close()
    assert line.transport.disconnecting and not closed.called
    line.close()
    assert closed.called


def test_a_connection_knows_the_factory_that_made_it() -> None:
    factory = ConnectionFactory(Pool(), "gpu-a")
    connection = factory.buildProtocol(None)
    assert connection.origin is factory
    assert connection.host == "gpu-a"


def test_a_reason_phrase_is_passed_on_only_when_short_and_printable() -> None:
    assert shown_phrase(200, b"Fine") == b"Fine"
    assert shown_phrase(503, b"\x1b[31mred") == b"Service Unavailable"
    assert shown_phrase(404, b"x" * (MAX_PHRASE + 1)) == b"Not Found"
    assert shown_phrase(599, b"\xff") == b""

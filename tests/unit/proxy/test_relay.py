"""crossbar.proxy.relay's ``StreamBody`` and ``FirstContent`` (and crossbar.http.timers'
``stop``), with a Clock, a fake client request and a fake upstream transport: what reaches
the client, when the idle timer fires, and what reaches the upstream socket."""

from __future__ import annotations

from typing import Any, cast

import pytest
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone

from crossbar.http.timers import Deadline, nothing, stop
from crossbar.proxy.relay import HELD_MOST, FirstContent, StreamBody
from tests.support import RecordingProducer

IDLE = 30.0


class FakeRequest:
    """The client's request: only ``write`` is used."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


class Body:
    """A StreamBody connected to fakes, and what its callbacks were given."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.request = FakeRequest()
        self.transport = RecordingProducer()
        self.idle = 0
        self.stalls = 0
        self.ends: list[Failure] = []
        self.body = StreamBody(
            cast(server.Request, self.request),
            self.clock,
            IDLE,
            self.on_idle,
            self.ends.append,
            self.on_stall,
        )
        self.body.makeConnection(cast(Any, self.transport))

    def on_idle(self) -> None:
        self.idle += 1

    def on_stall(self) -> None:
        self.stalls += 1

    @property
    def timers(self) -> int:
        return len(self.clock.getDelayedCalls())


@pytest.fixture
def b() -> Body:
    return Body()


def test_chunks_go_to_the_request_as_they_come_and_are_counted(b: Body) -> None:
    b.body.dataReceived(b"data: {}\n\n")
    b.body.dataReceived(b"data: [DONE]\n\n")
    assert b.request.written == [b"data: {}\n\n", b"data: [DONE]\n\n"]
    assert b.body.sent == 24
    b.body.dataReceived(b"")
    assert b.body.sent == 24


def test_no_timer_until_armed(b: Body) -> None:
    b.body.dataReceived(b"x")
    assert b.timers == 0
    b.clock.advance(IDLE * 10)
    assert b.idle == 0


def test_armed_timer_calls_on_idle_after_idle_timeout_without_data(b: Body) -> None:
    b.body.arm()
    b.body.arm()  # arming twice keeps one timer
    assert b.timers == 1
    b.clock.advance(IDLE - 0.001)
    assert b.idle == 0
    b.clock.advance(0.001)
    assert b.idle == 1
    b.clock.advance(IDLE * 10)
    assert b.idle == 1


def test_each_chunk_pushes_the_timer_back(b: Body) -> None:
    b.body.arm()
    for _ in range(5):
        b.clock.advance(IDLE - 1)
        b.body.dataReceived(b"x")
    assert b.idle == 0
    b.clock.advance(IDLE - 0.001)
    assert b.idle == 0
    b.clock.advance(0.001)
    assert b.idle == 1


def test_a_timer_that_finds_a_chunk_since_waits_only_for_the_rest(b: Body) -> None:
    """The timer is not moved by each chunk: when it fires after one, it waits for what is
    left of ``idle_timeout`` after that chunk, with one timer at a time."""
    b.body.arm()
    b.clock.advance(IDLE / 2)
    b.body.dataReceived(b"x")
    b.clock.advance(IDLE / 2)  # the first firing: a chunk came half a timeout ago
    assert (b.idle, b.timers) == (0, 1)
    b.clock.advance(IDLE / 2 - 0.001)
    assert b.idle == 0
    b.clock.advance(0.001)
    assert (b.idle, b.timers) == (1, 0)


def test_a_paused_body_is_never_idle(b: Body) -> None:
    """A client that reads slowly pauses the upstream: the host is not idle then."""
    b.body.arm()
    b.clock.advance(IDLE - 1)
    b.body.pauseProducing()
    assert b.transport.calls == ["pause"]
    assert b.timers == 1  # the stall's, not the host's idle timer
    b.clock.advance(IDLE * 10)
    assert b.idle == 0


def test_a_pause_as_long_as_idle_timeout_is_a_stalled_client(b: Body) -> None:
    """A client that reads nothing holds a host's connection, and its GPU, for nothing."""
    b.body.arm()
    b.body.pauseProducing()
    b.clock.advance(IDLE - 1)
    b.body.resumeProducing()  # it read: the next pause starts from nothing
    b.body.pauseProducing()
    b.clock.advance(IDLE - 1)
    assert b.stalls == 0
    b.clock.advance(1)
    assert (b.stalls, b.idle) == (1, 0)
    b.body.pauseProducing()  # paused again: still one stall, one timer at most
    assert b.timers <= 1


def test_resume_restarts_a_whole_idle_timeout(b: Body) -> None:
    b.body.arm()
    b.clock.advance(IDLE - 1)
    b.body.pauseProducing()
    b.clock.advance(IDLE * 10)
    b.body.resumeProducing()
    assert b.transport.calls == ["pause", "resume"]
    b.clock.advance(IDLE - 0.001)
    assert b.idle == 0
    b.clock.advance(0.001)
    assert b.idle == 1


def test_stop_producing_stops_the_timer_and_reaches_the_transport(b: Body) -> None:
    b.body.arm()
    b.body.stopProducing()
    assert b.transport.calls == ["stop"]
    assert b.timers == 0
    b.clock.advance(IDLE * 10)
    assert b.idle == 0


def test_connection_lost_stops_the_timer_and_gives_the_reason_to_on_end(b: Body) -> None:
    b.body.arm()
    reason = Failure(ConnectionLost("upstream reset"))
    b.body.connectionLost(reason)
    assert b.ends == [reason]
    assert b.timers == 0
    b.clock.advance(IDLE * 10)
    assert b.idle == 0
    assert b.transport.calls == []


def test_a_clean_end_is_response_done(b: Body) -> None:
    b.body.connectionLost()
    assert len(b.ends) == 1
    assert b.ends[0].check(ResponseDone)


def test_the_end_after_the_idle_timer_fired_raises_nothing(b: Body) -> None:
    b.body.arm()
    b.clock.advance(IDLE)
    b.body.pauseProducing()
    b.body.stopProducing()
    b.body.connectionLost(Failure(ConnectionLost()))
    assert (b.idle, len(b.ends)) == (1, 1)
    assert b.transport.calls == ["pause", "stop"]


# -- timers.stop ------------------------------------------------------------------------------


def test_stop_cancels_a_pending_call() -> None:
    clock = Clock()
    fired: list[int] = []
    call = clock.callLater(1, fired.append, 1)
    stop(call)
    assert not call.active()
    clock.advance(2)
    assert fired == []


def test_stop_of_nothing_a_fired_or_a_cancelled_call_does_nothing() -> None:
    clock = Clock()
    fired: list[int] = []
    done = clock.callLater(1, fired.append, 1)
    clock.advance(1)
    cancelled = clock.callLater(1, fired.append, 2)
    cancelled.cancel()
    stop(None)
    stop(done)
    stop(cancelled)
    stop(cancelled)
    clock.advance(5)
    assert fired == [1]


def test_each_chunk_goes_to_the_tap_s_feed_of_the_moment(b: Body) -> None:
    """A reader changes its ``feed`` as the stream goes on (every event read until the
    first content, then only the tail kept): each chunk must reach the current one."""
    seen: list[tuple[str, bytes]] = []

    class Reader:
        due = float("inf")

        def __init__(self) -> None:
            self.feed = self.first

        def first(self, data: bytes) -> None:
            seen.append(("first", data))
            self.feed = self.later

        def later(self, data: bytes) -> None:
            seen.append(("later", data))

        def trim(self, sent: int) -> None:
            raise AssertionError("never due")

    b.body.tap = Reader()
    for data in (b"a", b"b", b"c"):
        b.body.dataReceived(data)
    assert seen == [("first", b"a"), ("later", b"b"), ("later", b"c")]


def test_the_tap_is_trimmed_each_time_the_bytes_relayed_pass_its_due(b: Body) -> None:
    """A reader keeps a stream's tail by a bare append; the relay, which counts the bytes
    anyway, asks it to trim them every so often."""
    trims: list[int] = []

    class Reader:
        due = 5.0

        def feed(self, data: bytes) -> None:
            pass

        def trim(self, sent: int) -> None:
            trims.append(sent)
            self.due = sent + 5

    b.body.tap = Reader()
    for data in (b"abc", b"def", b"gh", b"ijklmn", b"o"):
        b.body.dataReceived(data)
    assert trims == [6, 14]


def test_a_lent_deadline_serves_the_body_then_is_left_to_its_lender() -> None:
    """A connection's deadline, lent: pointed at the body's ``on_idle`` while it streams,
    cleared (its timer kept for the lender) when the body ends, and moved by nothing that
    comes after."""
    clock = Clock()
    lent = Deadline(clock, nothing)
    lent.lender = object()
    idle: list[int] = []
    body = StreamBody(
        cast(server.Request, FakeRequest()), clock, IDLE, lambda: idle.append(1),
        lambda reason: None, lambda: None, lent,
    )  # fmt: skip
    body.makeConnection(cast(Any, RecordingProducer()))
    body.arm()
    clock.advance(IDLE)
    assert idle == [1]
    body.arm()
    body.dataReceived(b"x")
    body.connectionLost(Failure(ResponseDone()))
    assert lent.due is None and len(clock.getDelayedCalls()) == 1  # the lender's timer
    body.dataReceived(b"late")
    body.resumeProducing()
    assert lent.due is None
    clock.advance(IDLE * 2)
    assert idle == [1]


class Opening:
    """What a FirstContent told, in order."""

    def __init__(self) -> None:
        self.told: list[object] = []

    def opened(self) -> bool:
        self.told.append("opened")
        return True

    def kept_alive(self, comment: bytes) -> None:
        self.told.append(comment)

    def failed(self, why: str, held: bytes | None, broke: bool) -> None:
        self.told.append((why, held, broke))

    def load_failed(self) -> None:
        self.told.append("load failed")


def gate(code: int = 200, streamed: bool = True) -> tuple[Body, Opening, FirstContent]:
    body, opening = Body(), Opening()
    first = FirstContent(body.body, code, streamed, opening)
    first.makeConnection(cast(Any, body.transport))
    return body, opening, first


def test_pings_are_told_apart_and_the_first_event_opens_the_stream() -> None:
    body, opening, first = gate()
    body.body.arm()
    first.dataReceived(b': ping\n\n: ping\r\n\r\ndata: {"choices"')
    assert opening.told == [b": ping\n\n", b": ping\n\n"] and body.request.written == []
    body.clock.advance(IDLE - 1)
    first.dataReceived(b":[]}\n\ndata: more\n\n")  # a ping or a part keeps the host alive
    body.clock.advance(IDLE - 1)
    assert body.idle == 0
    assert opening.told[-1] == "opened"
    assert b"".join(body.request.written) == b'data: {"choices":[]}\n\ndata: more\n\n'


def test_after_the_first_content_each_chunk_goes_straight_to_the_body() -> None:
    body, _, first = gate()
    first.dataReceived(b"data: {}\n\n")
    assert first.dataReceived == body.body.dataReceived  # no step of the gate's per chunk
    assert first.connectionLost == body.body.connectionLost


def test_an_error_event_or_a_break_before_content_is_a_failure_and_the_host_let_go() -> None:
    _, opening, first = gate()
    first.dataReceived(b'event: error\ndata: {"type":"error"}\n\n')
    assert opening.told == [("an error event before any content", None, False)]
    body, opening, first = gate()
    first.dataReceived(b": ping\n\n")
    first.connectionLost(Failure(ConnectionLost("reset")))
    [(why, held, broke)] = opening.told[1:]
    assert str(why).startswith("broke before any content") and (held, broke) == (None, True)
    assert body.ends == [] and "stop" in body.transport.calls


def test_an_error_status_is_held_whole_and_a_long_one_relayed_as_it_came() -> None:
    _, opening, first = gate(503, streamed=False)
    first.dataReceived(b'{"error":')
    first.dataReceived(b'"busy"}')
    first.connectionLost(Failure(ResponseDone()))
    assert opening.told == [("answered 503", b'{"error":"busy"}', False)]
    body, opening, first = gate(500, streamed=False)
    first.dataReceived(b"x" * (HELD_MOST + 1))  # never more than HELD_MOST held
    assert opening.told == ["opened"] and len(b"".join(body.request.written)) == HELD_MOST + 1


def test_an_event_never_whole_is_held_only_up_to_the_bound() -> None:
    body, opening, first = gate()
    first.dataReceived(b"data: " + b"x" * HELD_MOST)
    assert opening.told == ["opened"] and body.request.written

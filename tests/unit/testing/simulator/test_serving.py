"""crossbar.testing.simulator.serving: the simulator's HTTP side over a StringTransport and a
Clock. Its answers carry llama-server's headers, an error closes the connection, a bug
answers 500 rather than hanging, a client that leaves stops the work, and a stream is paced
by the clock, paused by backpressure and can be told to break."""

from __future__ import annotations

import io
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.server import Request

from crossbar.testing import LogCapture
from crossbar.testing.simulator.serving import (
    ConnectionTracker,
    QuietSite,
    SimResource,
    SSEStream,
    query,
    send,
    send_error,
    wants_stream,
)

Handle = Callable[[Request], Coroutine[Any, Any, None]]


@attrs.define
class Pace:
    chunk_interval: float = 0.05
    active_streams: int = 0
    chunks_sent: int = 0


class Served:
    """A simulator site on a Clock, one client connection on a StringTransport."""

    def __init__(self, handle: Handle | Callable[[Clock], Handle], on_clock: bool = False) -> None:
        self.clock = Clock()
        if on_clock:
            handle = handle(self.clock)  # type: ignore[call-arg,assignment]
        self.recorded: list[bytes] = []
        self.lost = 0
        resource = SimResource(lambda r: self.recorded.append(r.uri), handle)
        site = QuietSite(resource, reactor=self.clock)
        self.tracker = ConnectionTracker(site, self._lost)
        self.protocol = self.tracker.buildProtocol(None)
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)

    def _lost(self) -> None:
        self.lost += 1

    def ask(self, method: bytes = b"GET", path: bytes = b"/health", body: bytes = b"") -> None:
        head = b"%s %s HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n" % (
            method,
            path,
            len(body),
        )
        self.protocol.dataReceived(head + body)

    @property
    def answer(self) -> bytes:
        data: bytes = self.transport.value()
        return data


def answering(status: int, data: bytes) -> Handle:
    async def handle(request: Request) -> None:
        send(request, status, data)

    return handle


def test_an_answer_has_llama_servers_headers_and_keeps_the_connection() -> None:
    served = Served(answering(200, b'{"status":"ok"}'))
    served.ask()

    head, _, body = served.answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    lines = head.lower().split(b"\r\n")
    assert b"server: llama.cpp" in lines
    assert b"keep-alive: timeout=5, max=100" in lines
    assert b"content-length: 15" in lines
    assert b"content-type: application/json; charset=utf-8" in lines
    assert body == b'{"status":"ok"}'
    assert not served.transport.disconnecting
    assert served.recorded == [b"/health"]


def test_an_error_closes_the_connection_in_llama_servers_shape() -> None:
    async def handle(request: Request) -> None:
        send_error(request, 404, "File Not Found")

    served = Served(handle)
    served.ask()

    assert served.answer.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert b"\r\nConnection: close\r\n" in served.answer
    assert served.answer.endswith(
        b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
    )
    assert served.transport.disconnecting


def test_a_bug_in_the_simulator_answers_500_not_a_hang() -> None:
    async def handle(request: Request) -> None:
        raise ZeroDivisionError("a bug")

    served = Served(handle)
    capture = LogCapture()
    try:
        served.ask()
    finally:
        capture.close()

    assert served.answer.startswith(b"HTTP/1.1 500 ")
    assert b'"message":"a bug"' in served.answer
    assert capture.matching("crossbar simulator failed to answer")


def test_a_client_that_leaves_cancels_the_work() -> None:
    cancelled: list[bool] = []

    async def handle(request: Request) -> None:
        try:
            await Deferred()
        except CancelledError:
            cancelled.append(True)
            raise

    served = Served(handle)
    served.ask()
    served.protocol.connectionLost(Failure(ConnectionDone()))

    assert cancelled == [True]
    assert served.lost == 1
    assert served.answer == b""


def streaming(
    pace: Pace,
    events: list[tuple[bool, bytes]],
    reset_after: int | None = None,
    streams: list[SSEStream] | None = None,
) -> Served:
    """A site whose one answer is a stream of ``events``, paced by its clock."""

    def on(clock: Clock) -> Handle:
        async def handle(request: Request) -> None:
            request.setHeader(b"content-type", b"text/event-stream")
            stream = SSEStream(pace, clock, request, iter(events), reset_after)
            if streams is not None:
                streams.append(stream)
            stream.start()
            await stream.done

        return handle

    return Served(on, on_clock=True)


EVENTS = [
    (False, b"data: role\n\n"),
    (True, b"data: a\n\n"),
    (True, b"data: b\n\n"),
    (False, b"data: [DONE]\n\n"),
]


def test_a_stream_writes_a_token_each_interval() -> None:
    pace = Pace(chunk_interval=0.05)
    served = streaming(pace, EVENTS)
    served.ask(b"POST", b"/v1/chat/completions")

    assert b"data: role" in served.answer and b"data: a" not in served.answer
    assert pace.active_streams == 1
    served.clock.advance(0.05)
    assert b"data: a" in served.answer and b"data: b" not in served.answer
    served.clock.advance(0.05)
    assert served.answer.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # chunked, finished
    assert (pace.active_streams, pace.chunks_sent) == (0, 2)


def test_a_paused_stream_writes_nothing_until_resumed() -> None:
    pace = Pace(chunk_interval=0.05)
    streams: list[SSEStream] = []
    served = streaming(pace, EVENTS, streams=streams)
    served.ask(b"POST", b"/v1/chat/completions")
    (stream,) = streams

    stream.pauseProducing()  # the client's socket is full
    served.clock.advance(1.0)
    before = served.answer
    served.clock.advance(1.0)
    assert served.answer == before
    assert b"data: b" not in served.answer
    stream.resumeProducing()
    served.clock.advance(0.05)
    assert served.answer.endswith(b"0\r\n\r\n")


def test_a_stream_told_to_break_aborts_after_that_many_tokens() -> None:
    pace = Pace(chunk_interval=0.05)
    served = streaming(pace, EVENTS, reset_after=1)
    served.ask(b"POST", b"/v1/chat/completions")
    served.clock.advance(0.05)
    assert b"data: a" in served.answer
    assert not served.transport.disconnecting
    served.clock.advance(0.05)

    assert served.transport.disconnecting
    assert b"data: b" not in served.answer
    assert pace.active_streams == 0


def test_stopping_the_stream_ends_it_and_its_timer() -> None:
    pace = Pace(chunk_interval=0.05)
    streams: list[SSEStream] = []
    served = streaming(pace, EVENTS, streams=streams)
    served.ask(b"POST", b"/v1/chat/completions")
    streams[0].done.cancel()

    assert pace.active_streams == 0
    assert not served.clock.getDelayedCalls()


class Asked:
    """What the helpers read of a request, without a connection."""

    def __init__(self, method: bytes, path: bytes, body: bytes, args: dict[bytes, list[bytes]]):
        self.method, self.path, self.args = method, path, args
        self.content = io.BytesIO(body)


def test_wants_stream_only_for_a_generating_post_that_asks_for_it() -> None:
    def asks(method: bytes, path: bytes, body: bytes) -> bool:
        return wants_stream(Asked(method, path, body, {}))  # type: ignore[arg-type]

    assert asks(b"POST", b"/v1/chat/completions", b'{"stream": true}')
    assert not asks(b"POST", b"/v1/chat/completions", b'{"stream": "yes"}')
    assert not asks(b"POST", b"/v1/chat/completions", b"not json")
    assert not asks(b"POST", b"/v1/models", b'{"stream": true}')
    assert not asks(b"GET", b"/v1/chat/completions", b'{"stream": true}')


def test_query_reads_one_argument_or_nothing() -> None:
    asked = Asked(b"GET", b"/props", b"", {b"model": [b"qwen", b"other"]})
    assert query(asked, "model") == "qwen"  # type: ignore[arg-type]
    assert query(asked, "autoload") == ""  # type: ignore[arg-type]

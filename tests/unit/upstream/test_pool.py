"""crossbar.upstream.pool: the proxy's client for its hosts, on a memory reactor. What a
request looks like on the wire, which kept-alive connection the next request reuses, how
long an idle one is kept, and what a reload or a stop does to them. Over real sockets:
tests/system/test_upstream.py."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.testing import MemoryReactorClock

from crossbar.testing import LineTransport
from crossbar.upstream import Response, Upstreams
from crossbar.upstream.pool import BODY_APART

URLS = {"gpu-a": "http://10.0.0.1:8081/base/", "gpu-b": "http://gpu-b"}
TIMEOUTS = {"gpu-a": 3.0, "gpu-b": 3.0}
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


class Fleet:
    """An ``Upstreams`` on a memory reactor, and the connections it opened, in order."""

    def __init__(self, **options: Any) -> None:
        self.clock = MemoryReactorClock()
        self.upstreams = Upstreams(self.clock, URLS, TIMEOUTS, clock=self.clock, **options)
        self.accepted = 0
        self.lines: list[LineTransport] = []

    @property
    def connecting(self) -> int:
        return len(self.clock.tcpClients) - self.accepted

    def accept(self) -> LineTransport:
        host, port, factory, *_ = self.clock.tcpClients[self.accepted]
        self.accepted += 1
        protocol = factory.buildProtocol(IPv4Address("TCP", host, port))
        transport = LineTransport(self.clock)
        transport.protocol = protocol
        protocol.makeConnection(transport)
        self.lines.append(transport)
        return transport

    def ask(
        self, host: str = "gpu-a", body: bytes | None = b"{}", method: bytes = b"POST"
    ) -> Deferred[Response]:
        return self.upstreams.request(
            host, method, b"/v1/chat/completions", b"X-Request-Id: 7\r\n", body
        )

    def answered(
        self, line: LineTransport, asked: Deferred[Response], data: bytes = OK
    ) -> Response:
        line.protocol.dataReceived(data)
        got: list[Response] = []
        asked.addCallback(got.append)
        assert got, "no answer"
        return got[0]


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


def test_the_request_goes_out_in_one_write_with_the_hosts_path_and_name(fleet: Fleet) -> None:
    fleet.ask()
    assert fleet.clock.tcpClients[0][:2] == ("10.0.0.1", 8081)
    line = fleet.accept()

    assert line.writes == [
        b"POST /base/v1/chat/completions HTTP/1.1\r\nHost: 10.0.0.1:8081\r\n"
        b"X-Request-Id: 7\r\nContent-Length: 2\r\n\r\n{}"
    ]


def test_a_host_on_its_default_port_is_named_without_it_and_a_get_has_no_length(
    fleet: Fleet,
) -> None:
    fleet.ask("gpu-b", body=None, method=b"GET")
    assert fleet.clock.tcpClients[0][1] == 80
    line = fleet.accept()
    assert line.value() == (
        b"GET /v1/chat/completions HTTP/1.1\r\nHost: gpu-b\r\nX-Request-Id: 7\r\n\r\n"
    )


def test_a_large_body_goes_out_apart_from_the_head_never_copied(fleet: Fleet) -> None:
    body = b"x" * (BODY_APART + 1)
    fleet.ask(body=body)
    line = fleet.accept()

    head, sent = line.writes
    assert head.endswith(b"Content-Length: %d\r\n\r\n" % len(body))
    assert sent is body


def test_the_next_request_reuses_the_kept_connection(fleet: Fleet) -> None:
    asked = fleet.ask()
    line = fleet.accept()
    fleet.answered(line, asked)

    again = fleet.ask()
    assert fleet.connecting == 0  # no new connection
    assert line.value().count(b"POST ") == 2
    assert fleet.answered(line, again).code == 200


def test_two_requests_at_once_take_two_connections(fleet: Fleet) -> None:
    fleet.ask()
    fleet.ask()
    assert fleet.connecting == 2


def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    fleet = Fleet(idle_timeout=30.0)
    asked = fleet.ask()
    line = fleet.accept()
    fleet.answered(line, asked)

    fleet.clock.advance(29.9)
    assert not line.disconnecting
    fleet.clock.advance(0.1)
    assert line.disconnecting
    fleet.clock.advance(0)
    fleet.ask()
    assert fleet.connecting == 1  # a new one: the old was closed


def test_at_most_max_idle_connections_are_kept_per_host() -> None:
    fleet = Fleet(max_idle=1)
    first, second = fleet.ask(), fleet.ask()
    line1, line2 = fleet.accept(), fleet.accept()
    fleet.answered(line1, first)
    fleet.answered(line2, second)

    assert not line1.disconnecting
    assert line2.disconnected  # aborted: one is kept


def test_a_host_that_moved_keeps_none_of_its_old_connections(fleet: Fleet) -> None:
    done, streaming = fleet.ask(), fleet.ask()
    idle_line, busy_line = fleet.accept(), fleet.accept()
    fleet.answered(idle_line, done)
    response = fleet.answered(
        busy_line, streaming, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}"
    )

    fleet.upstreams.set_hosts({**URLS, "gpu-a": "http://10.0.0.9:8081"}, TIMEOUTS, fresh=["gpu-a"])
    assert idle_line.disconnecting
    busy_line.protocol.dataReceived(b"{}")  # its answer ends after the move
    assert busy_line.disconnected
    assert response.code == 200

    fleet.clock.advance(0)
    fleet.ask()
    assert fleet.clock.tcpClients[-1][:2] == ("10.0.0.9", 8081)


def test_a_host_that_stays_in_a_reload_keeps_its_idle_connection(fleet: Fleet) -> None:
    asked = fleet.ask()
    line = fleet.accept()
    fleet.answered(line, asked)
    fleet.upstreams.set_hosts(URLS, {"gpu-a": 10.0, "gpu-b": 3.0})

    fleet.ask()
    assert fleet.connecting == 0
    assert not line.disconnecting


def test_a_host_that_left_the_config_has_its_idle_connections_closed(fleet: Fleet) -> None:
    asked = fleet.ask()
    line = fleet.accept()
    fleet.answered(line, asked)
    fleet.upstreams.set_hosts({"gpu-b": URLS["gpu-b"]}, TIMEOUTS)

    assert line.disconnecting
    with pytest.raises(KeyError):
        fleet.ask()


def test_closing_closes_the_idle_connections_and_keeps_no_more(fleet: Fleet) -> None:
    done, streaming = fleet.ask(), fleet.ask()
    idle_line, busy_line = fleet.accept(), fleet.accept()
    fleet.answered(idle_line, done)
    fleet.answered(busy_line, streaming, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}")

    closed = fleet.upstreams.close()
    assert idle_line.disconnecting and not closed.called
    fleet.clock.advance(0)
    assert closed.called
    busy_line.protocol.dataReceived(b"{}")
    assert busy_line.disconnected  # not kept after the stop

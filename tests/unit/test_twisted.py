"""crossbar._twisted in memory: what it reads of a request and its channel (request line and
version before the headers end, handling, the channel once the connection is lost, the
parser's refusals) still exists and means what it did, and ``write_now`` on a transport
that is not plain TCP is Twisted's own ``transport.write``.

The TCP attributes and ``write_now`` on a real loopback connection are in
``tests/system/test_twisted.py``.
"""

from __future__ import annotations

from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.client import _HTTP11ClientFactory

from crossbar._twisted import (
    TESTED_TWISTED,
    ParserRefusals,
    QuietPool,
    bytes_waiting,
    direct,
    handling_request,
    request_line,
    request_version,
    twistd_log_observer,
    write_now,
)

# -- direct() ----------------------------------------------------------------------------------


def test_direct_is_none_for_a_transport_that_is_not_tcp() -> None:
    """Anything else (a test transport, a wrapper) is written to as usual."""
    assert direct(StringTransport()) is None
    assert direct(object()) is None


# -- bytes_waiting() ----------------------------------------------------------------------------


def test_bytes_waiting_is_false_for_a_transport_that_is_not_plain_tcp() -> None:
    assert not bytes_waiting(direct(StringTransport()))


# -- no TCP connection ---------------------------------------------------------------------------


def test_without_a_connection_it_is_transport_write() -> None:
    """With no direct connection, the data simply goes to transport.write."""
    transport = StringTransport()
    write_now(None, transport, b"GET /health HTTP/1.1\r\n\r\n")
    write_now(None, transport, b"more")
    assert transport.value() == b"GET /health HTTP/1.1\r\n\r\nmore"


# -- the private attributes, by name ---------------------------------------------------------


def _channel() -> http.HTTPChannel:
    channel = http.HTTPChannel()
    channel.requestFactory = _Held  # type: ignore[assignment]
    channel.makeConnection(StringTransport())
    return channel


class _Held(http.Request):
    """A request twisted.web hands over and nobody answers yet."""

    def process(self) -> None:
        pass


def test_request_line_is_known_before_the_headers_end() -> None:
    channel = _channel()
    assert request_line(channel) == (b"-", b"-")
    channel.dataReceived(b"POST /lab/v1/chat?x=1 HTTP/1.1\r\nHost: a\r\n")
    assert request_line(channel) == (b"POST", b"/lab/v1/chat?x=1")


def test_request_version_is_known_before_the_headers_end() -> None:
    channel = _channel()
    assert request_version(channel) == b"-"
    channel.dataReceived(b"GET / HTTP/1.0\r\n")
    assert request_version(channel) == b"HTTP/1.0"


def test_handling_request_is_true_until_the_answer_is_finished() -> None:
    channel = _channel()
    assert not handling_request(channel)
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert handling_request(channel)
    request = channel.requests[-1]
    request.finish()
    assert not handling_request(channel)


def test_a_request_has_no_channel_once_the_connection_is_lost() -> None:
    """``ProxyRequest.write`` drops a chunk for a client that has gone by this (public)
    attribute, with no call to ask."""
    channel = _channel()
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    request = channel.requests[-1]
    assert request.channel is channel
    channel.connectionLost(Failure(ConnectionDone()))
    assert request.channel is None


class _Refusing(ParserRefusals):
    def bad_request(self) -> None:
        self.refused = True
        self.transport.loseConnection()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        b"Content-Length: 2\r\nContent-Length: 2\r\n",
        b"Content-Length: x\r\n",
        b"No colon\r\n",
    ],
)
def test_the_parser_s_refusals_go_through_respond_to_bad_request(head: bytes) -> None:
    """``_respondToBadRequestAndDisconnect`` is still where twisted.web refuses a head."""
    channel = _Refusing()
    channel.requestFactory = _Held  # type: ignore[assignment]
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"POST / HTTP/1.1\r\nHost: a\r\n" + head + b"\r\n{}")
    assert getattr(channel, "refused", False)
    assert transport.value() == b""  # twisted.web's own bare 400 was not sent


def test_the_quiet_pool_builds_its_connections_with_the_quiet_factory() -> None:
    pool = QuietPool(Clock())
    factory = pool._factory
    assert issubclass(factory, _HTTP11ClientFactory)
    assert factory.noisy is False
    # The pool builds each connection's factory from _factory(quiescentCallback, metadata).
    assert factory(lambda protocol: None, "metadata").noisy is False


def test_setup_cfg_pins_twisted_to_the_range_checked() -> None:
    """The install requirement and the range crossbar._twisted was read against agree, and
    the Twisted running these tests is inside it."""
    spec = next(r for r in requires("llama-crossbar") or [] if r.lower().startswith("twisted"))
    pinned = {str(part) for part in Requirement(spec).specifier}
    assert pinned == {part.strip() for part in TESTED_TWISTED.split(",")}
    running = tuple(int(n) for n in version("twisted").split(".")[:2])
    low = next(p for p in pinned if p.startswith(">="))[2:]
    high = next(p for p in pinned if p.startswith("<"))[1:]
    assert tuple(int(n) for n in low.split(".")) <= running < (int(high),), version("twisted")


def test_twistd_s_own_observer_is_what_its_options_say(tmp_path: Path) -> None:
    """With --logfile, twistd's observer writes there (crossbar filters it, nothing more)."""
    path = tmp_path / "crossbar.log"
    observer = twistd_log_observer({"logfile": str(path), "nodaemon": True})
    observer({"log_format": "{line}", "line": "hello", "log_time": 0.0, "log_system": "-"})
    assert "hello" in path.read_text()

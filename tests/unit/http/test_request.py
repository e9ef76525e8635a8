"""crossbar.http.request: a request of the proxy's site, fed raw bytes through a
connection the site built (:mod:`tests.support.doors`): the dispatch to the proxy or the pages,
and the body limits, from ``Content-Length`` before the body is read and as a chunked
upload arrives."""

from __future__ import annotations

import time

import pytest
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.resource import Resource

from crossbar.config import Limits
from crossbar.http.request import ProxyRequest, when_over
from crossbar.http.site import Site
from crossbar.http.timers import http_date
from tests.support import doors
from tests.support.doors import Door, chunked, get, post
from tests.support.errors import api_error


@pytest.fixture
def d() -> Door:
    """A site with the default limits."""
    return doors.door()


# -- dispatch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [doors.CHAT, b"/", b"/x%2Fy/v1/models?a=b"])
def test_any_other_path_goes_straight_to_the_proxy(d: Door, path: bytes) -> None:
    d.connect().send(post(path))
    [request] = d.proxy.rendered
    assert d.pages.rendered == [] and request.uri == path
    assert isinstance(request, ProxyRequest) and request.site is d.site
    assert request.content is not None and request.content.read() == b"{}"
    headers = request.responseHeaders
    # A Date as twisted.web would send (the host's replaces it); no Server: the host's
    # answer says what it is.
    assert headers.getRawHeaders(b"date") == [http_date()]
    assert not headers.hasHeader(b"server")


def test_a_streamed_chunk_goes_out_framed_and_none_once_the_client_has_gone(d: Door) -> None:
    conn = d.connect()
    conn.send(post(doors.CHAT))
    [request] = d.proxy.rendered
    request.write(b"data: 1\n\n")  # the head, then the first chunk
    conn.transport.clear()
    request.write(b"data: 2\n\n")
    assert conn.transport.value() == b"9\r\ndata: 2\n\n\r\n"
    conn.channel.connectionLost(Failure(ConnectionDone()))
    conn.transport.clear()
    request.write(b"data: 3\n\n")  # dropped, not counted
    assert conn.transport.value() == b""
    assert request.sentLength == 18


@pytest.mark.parametrize("path", [b"/_crossbar", b"/_crossbar/", b"/_crossbar/status"])
def test_the_pages_go_the_usual_way(d: Door, path: bytes) -> None:
    d.connect().send(get(path))
    [request] = d.pages.rendered
    assert d.proxy.rendered == []
    assert request.responseHeaders.hasHeader(b"server")


def test_a_site_without_a_proxy_dispatches_as_twisted_web_does() -> None:
    pages = doors.Leaf()
    root = Resource()
    root.putChild(b"_crossbar", pages)
    channel = Site(root, timeout=None).buildProtocol(doors.PEER)
    channel.makeConnection(StringTransport())
    channel.dataReceived(get(b"/_crossbar/metrics"))
    assert len(pages.rendered) == 1
    channel.connectionLost(Failure(ConnectionDone()))  # its head deadline's timer with it


def test_the_date_is_http_s_format_and_made_once_a_second() -> None:
    first = http_date()
    now = int(time.time())
    assert first in (http.datetimeToString(now), http.datetimeToString(now - 1))
    assert http_date() is first or int(time.time()) != now


# -- body limits ------------------------------------------------------------------------------


def test_a_body_announced_over_max_body_is_413_before_it_is_read() -> None:
    d = doors.door(Limits(max_body=10))
    ok, over = d.connect(), d.connect()
    ok.send(post(body=b"x" * 10))
    over.send(post(body=b"x" * 11, extra=b"Expect: 100-continue\r\n")[:-11])
    assert over.refusal()[::2] == (413, api_error(413, "body too large"))
    assert b"100 Continue" not in over.answer and over.closed
    assert len(d.proxy.rendered) == 1


def test_a_refused_upload_is_drained_never_kept(d: Door) -> None:
    """10 MiB sent after a refused head: nothing of it is held or answered again."""
    conn = d.connect()
    conn.send(get(doors.CHAT, b"PUT", extra=b"Content-Length: %d\r\n" % (10 * doors.MiB)))
    answer = conn.answer
    request = conn.channel.requests[-1]
    piece = b"x" * 65536
    for _ in range(10 * doors.MiB // len(piece)):
        conn.send(piece)
    assert request.content is not None and request.content.tell() == 0
    assert request.content.getvalue() == b""
    assert d.site.body_memory == 0 and conn.answer == answer and d.rendered == []


def test_a_chunked_upload_is_cut_off_as_soon_as_it_passes_max_body() -> None:
    d = doors.door(Limits(max_body=10))
    conn = d.connect()
    conn.send(doors.CHUNKED_HEAD + chunked(b"x" * 6, end=False))
    assert conn.answer == b""
    conn.send(chunked(b"y" * 5))
    assert conn.refusal()[::2] == (413, api_error(413, "body too large"))
    assert d.site.body_memory == 0 and d.rendered == []


def test_bodies_held_at_once_are_capped_and_released_when_each_request_ends() -> None:
    d = doors.door(Limits(max_body_memory=100, max_body=100))
    first, second = d.connect(), d.connect()
    first.send(post(body=b"x" * 60))
    second.send(post(body=b"x" * 60)[:-60])  # refused before its body is sent
    status, headers, body = second.refusal()
    assert (status, body, headers[b"retry-after"]) == (503, api_error(503, "busy"), b"1")
    assert d.site.body_memory == 60

    # Answered: the body is no longer held.
    d.proxy.rendered[0].finish()
    assert d.site.body_memory == 0
    third = d.connect()
    third.send(post(body=b"x" * 60))
    assert d.site.body_memory == 60 and len(d.proxy.rendered) == 2

    # The client gone (before or after the body came): released too.
    fourth = d.connect()
    fourth.send(post(body=b"x" * 40)[:-30])
    assert d.site.body_memory == 100
    fourth.channel.connectionLost(Failure(ConnectionError()))
    third.channel.connectionLost(Failure(ConnectionError()))
    assert d.site.body_memory == 0


def test_chunked_bodies_count_as_they_arrive() -> None:
    d = doors.door(Limits(max_body_memory=100, max_body=100))
    held = d.connect()
    held.send(post(body=b"x" * 50))
    conn = d.connect()
    conn.send(doors.CHUNKED_HEAD + chunked(b"y" * 40, end=False))
    assert d.site.body_memory == 90 and conn.answer == b""
    conn.send(chunked(b"z" * 20))
    assert conn.refusal()[::2] == (503, api_error(503, "busy"))
    assert d.site.body_memory == 50  # what the refused one held is let go at once

    ok = d.connect()
    ok.send(doors.CHUNKED_HEAD + chunked(b"a" * 30, b"b" * 20))
    [_, request] = d.proxy.rendered
    assert request.content is not None and request.content.read() == b"a" * 30 + b"b" * 20
    assert d.site.body_memory == 100
    request.finish()
    assert d.site.body_memory == 50


# -- the end of a request, told once -------------------------------------------------------------


def test_a_request_under_way_tells_its_end_once_when_it_finishes(d: Door) -> None:
    conn = d.connect()
    conn.send(post(doors.CHAT) + post(doors.CHAT))  # the second is pipelined
    first = d.proxy.rendered[0]
    told: list[tuple[object, int]] = []
    when_over(first, lambda why: told.append((why, len(d.proxy.rendered))))
    first.write(b"{}")
    first.finish()
    # As notifyFinish tells it: after the pipelined request behind it has begun.
    assert told == [(None, 2)]
    conn.channel.connectionLost(Failure(ConnectionDone()))
    assert told == [(None, 2)]


def test_a_request_whose_client_leaves_tells_why_once(d: Door) -> None:
    conn = d.connect()
    conn.send(post(doors.CHAT))
    [request] = d.proxy.rendered
    told: list[Failure | None] = []
    when_over(request, told.append)
    conn.channel.connectionLost(Failure(ConnectionDone()))
    [why] = told
    assert why is not None and why.check(ConnectionDone)


def test_a_request_already_over_is_told_at_once(d: Door) -> None:
    """(``notifyFinish`` would never tell it.)"""
    conn = d.connect()
    conn.send(post(doors.CHAT))
    [request] = d.proxy.rendered
    request.write(b"{}")
    request.finish()
    told: list[Failure | None] = []
    when_over(request, told.append)
    assert told == [None]


def test_the_client_s_address_is_asked_of_the_connection_once_not_per_request(d: Door) -> None:
    """A TCP transport makes a new address each time it is asked."""
    conn = d.connect()
    asked: list[object] = []
    peer = conn.transport.getPeer

    def counted() -> object:
        asked.append(1)
        return peer()

    conn.transport.getPeer = counted  # type: ignore[method-assign]
    for _ in range(3):
        conn.send(post(doors.CHAT))
        request = d.proxy.rendered[-1]
        assert request.getClientAddress() == doors.PEER
        request.write(b"{}")
        request.finish()
    assert len(d.proxy.rendered) == 3 and len(asked) <= 1

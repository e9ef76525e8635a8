"""crossbar.server.site: twisted.web fitted for the proxy. The body limit and the header
deadline are tested over real sockets in test_proxy and test_faults; here, with
twisted.web's own test channel, the dispatch of a request to the proxy or to the pages."""

from __future__ import annotations

import time

import pytest
from twisted.web import http, server
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyChannel

from crossbar.server.site import ProxyRequest, Site, http_date


class Leaf(Resource):
    """Records the requests it renders, and answers none of them yet."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.rendered: list[server.Request] = []

    def render(self, request: server.Request) -> object:
        self.rendered.append(request)
        return server.NOT_DONE_YET


def received(site: Site, method: bytes, path: bytes) -> ProxyRequest:
    channel = DummyChannel()
    channel.site = site
    request = ProxyRequest(channel)
    request.gotLength(0)
    request.requestReceived(method, path, b"HTTP/1.1")
    return request


@pytest.fixture
def pages() -> Leaf:
    return Leaf()


@pytest.fixture
def proxy() -> Leaf:
    return Leaf()


@pytest.fixture
def site(pages: Leaf, proxy: Leaf) -> Site:
    root = Resource()
    root.putChild(b"_crossbar", pages)
    return Site(root, proxy=proxy)


@pytest.mark.parametrize("path", [b"/lab/v1/chat/completions", b"/", b"/x%2Fy/v1/models?a=b"])
def test_any_other_path_goes_straight_to_the_proxy(
    site: Site, proxy: Leaf, pages: Leaf, path: bytes
) -> None:
    request = received(site, b"POST", path)
    assert proxy.rendered == [request] and pages.rendered == []
    assert request.site is site
    headers = request.responseHeaders
    # A Date as twisted.web would send (the host's replaces it); no Server: the host's
    # answer says what it is.
    assert headers.getRawHeaders(b"date") == [http_date()]
    assert not headers.hasHeader(b"server")


@pytest.mark.parametrize("path", [b"/_crossbar", b"/_crossbar/", b"/_crossbar/status"])
def test_the_pages_go_the_usual_way(site: Site, proxy: Leaf, pages: Leaf, path: bytes) -> None:
    request = received(site, b"GET", path)
    assert pages.rendered == [request] and proxy.rendered == []
    assert request.responseHeaders.hasHeader(b"server")


def test_a_site_without_a_proxy_dispatches_as_twisted_web_does(pages: Leaf) -> None:
    root = Resource()
    root.putChild(b"_crossbar", pages)
    request = received(Site(root), b"GET", b"/_crossbar/metrics")
    assert pages.rendered == [request]


def test_the_date_is_http_s_format_and_made_once_a_second() -> None:
    first = http_date()
    now = int(time.time())
    assert first in (http.datetimeToString(now), http.datetimeToString(now - 1))
    assert http_date() is first or int(time.time()) != now

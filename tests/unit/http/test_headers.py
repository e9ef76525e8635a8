"""crossbar.http.headers: which route a path names and which header lines cross to the
host. Pure rules, called directly."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossbar.config import Config, HostConfig, Secret
from crossbar.http import headers as rewrite
from crossbar.http.headers import (
    BadTarget,
    host_keys,
    json_body,
    parse_target,
    trusted_proxy,
    upstream_headers,
)

Headers = list[tuple[bytes, Sequence[bytes]]]


@pytest.mark.parametrize(
    ("uri", "route", "rest", "query"),
    [
        (b"/a/v1/x", "a", b"/v1/x", b""),
        (b"/a", "a", b"/", b""),
        (b"/a/", "a", b"/", b""),
        (b"/a/v1/models?x=1&y=2", "a", b"/v1/models", b"x=1&y=2"),
        (b"/a?x", "a", b"/", b"x"),
        (b"/a%2Fb/v1/x", "a%2Fb", b"/v1/x", b""),  # the route segment is never decoded
    ],
)
def test_parse_target(uri: bytes, route: str, rest: bytes, query: bytes) -> None:
    target = parse_target(uri)
    assert (target.route, target.rest, target.query) == (route, rest, query)


_SEGMENT = st.binary(max_size=12).filter(lambda b: b"/" not in b and b"?" not in b)


@settings(max_examples=500, deadline=None)
@given(uri=st.binary(max_size=64))
def test_any_target_is_a_route_path_or_a_bad_target(uri: bytes) -> None:
    """Whatever bytes a request line holds, splitting it either names a route or says
    why not (400 or 404): never another exception."""
    try:
        target = parse_target(uri)
    except BadTarget as e:
        assert e.status in (400, 404)
        return
    assert target.route and "/" not in target.route and "?" not in target.route
    assert target.rest.startswith(b"/")


@settings(max_examples=500, deadline=None)
@given(
    route=_SEGMENT.filter(lambda b: b != b""),
    rest=st.lists(_SEGMENT, max_size=5),
    query=st.none() | st.binary(max_size=20),
)
def test_a_route_path_splits_back_into_what_made_it(
    route: bytes, rest: list[bytes], query: bytes | None
) -> None:
    """``/<route>/<rest>?<query>`` comes apart into exactly its pieces, the route's
    bytes undecoded (a route that is not ASCII is simply unknown)."""
    path = b"/" + route + b"".join(b"/" + part for part in rest)
    uri = path if query is None else path + b"?" + query
    try:
        target = parse_target(uri)
    except BadTarget as e:
        assert e.status == 404 and not route.isascii()
        return
    assert target.route.encode("ascii") == route
    assert target.rest == (b"".join(b"/" + part for part in rest) or b"/")
    assert target.query == (query or b"")


@pytest.mark.parametrize("uri", [b"/", b"//x", b"/?a=1", b"", b"http://h/a/v1/x"])
def test_missing_route(uri: bytes) -> None:
    with pytest.raises(BadTarget, match="missing route") as info:
        parse_target(uri)
    assert info.value.status == 400


def test_route_that_is_not_ascii_is_unknown() -> None:
    with pytest.raises(BadTarget, match="unknown route") as info:
        parse_target(b"/caf\xc3\xa9/v1/models")
    assert info.value.status == 404


# -- json_body --------------------------------------------------------------------------------


def test_json_body_is_compact() -> None:
    body = json_body({"error": "upstream timeout", "host": "gpu-a", "n": [1, 2]})
    assert body == b'{"error":"upstream timeout","host":"gpu-a","n":[1,2]}'


def test_json_body_is_ascii() -> None:
    assert json_body({"error": "caf\u00e9"}) == b'{"error":"caf\\u00e9"}'


# -- upstream_headers -------------------------------------------------------------------------


def lines(
    headers: Headers, client: str = "10.1.2.3", secure: bool = False, trusted: bool = False
) -> list[bytes]:
    """The header lines for the host (credentials apart), each without its CRLF."""
    out, _ = upstream_headers(headers, client, secure, trusted)
    assert out.endswith(b"\r\n")
    return out[:-2].split(b"\r\n")


def credentials(headers: Headers) -> list[bytes]:
    """The client's credential lines, each without its CRLF."""
    _, out = upstream_headers(headers, "10.1.2.3", False)
    return out.split(b"\r\n")[:-1]


def test_plain_headers_pass_in_order_with_repeats_and_forwarded_added() -> None:
    headers: Headers = [
        (b"Host", [b"crossbar.lab:8080"]),
        (b"Accept", [b"text/event-stream", b"application/json"]),
        (b"Authorization", [b"Bearer k"]),
        (b"X-Trace", [b" a b "]),
        (b"Accept", [b"*/*"]),
    ]
    assert lines(headers) == [
        b"Accept: text/event-stream",
        b"Accept: application/json",
        b"X-Trace:  a b ",
        b"Accept: */*",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
        b"X-Forwarded-Host: crossbar.lab:8080",
    ]
    assert credentials(headers) == [b"Authorization: Bearer k"]


def test_the_client_s_credentials_come_apart_in_order() -> None:
    """The exchange sends them only to a host without a key, on a route without keys."""
    headers: Headers = [
        (b"x-api-key", [b"one"]),
        (b"Accept", [b"*/*"]),
        (b"AUTHORIZATION", [b"Bearer two", b"Basic dGhyZWU="]),
    ]
    assert credentials(headers) == [
        b"x-api-key: one",
        b"AUTHORIZATION: Bearer two",
        b"AUTHORIZATION: Basic dGhyZWU=",
    ]
    assert lines(headers) == [
        b"Accept: */*",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
    ]
    assert credentials([(b"Accept", [b"*/*"])]) == []


def test_hop_by_hop_and_framing_headers_are_not_forwarded() -> None:
    headers: Headers = [
        (b"Connection", [b"keep-alive"]),
        (b"Keep-Alive", [b"timeout=5"]),
        (b"Proxy-Authenticate", [b"Basic"]),
        (b"Proxy-Authorization", [b"Basic eA=="]),
        (b"Proxy-Connection", [b"keep-alive"]),
        (b"TE", [b"trailers"]),
        (b"Trailer", [b"X-Sum"]),
        (b"Trailers", [b"X-Sum"]),
        (b"Transfer-Encoding", [b"chunked"]),
        (b"Upgrade", [b"h2c"]),
        (b"Host", [b"crossbar"]),
        (b"Content-Length", [b"12"]),
        (b"Expect", [b"100-continue"]),
        (b"content-type", [b"application/json"]),
    ]
    assert lines(headers) == [
        b"content-type: application/json",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
        b"X-Forwarded-Host: crossbar",
    ]
    assert credentials(headers) == []


def test_headers_named_in_connection_are_dropped_whatever_their_case() -> None:
    headers: Headers = [
        (b"Connection", [b"close, X-Secret ", b"x-other, X-Api-Key"]),
        (b"x-secret", [b"s"]),
        (b"X-OTHER", [b"o"]),
        (b"X-Kept", [b"k"]),
        (b"X-Api-Key", [b"hop"]),
        (b"Authorization", [b"Bearer kept"]),
    ]
    assert lines(headers) == [
        b"X-Kept: k",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
    ]
    assert credentials(headers) == [b"Authorization: Bearer kept"]


def test_what_only_crossbar_may_say_is_never_taken_from_a_client() -> None:
    """A host (or its logs) must not believe a client that claims to be someone else,
    or that writes the headers crossbar itself adds."""
    headers: Headers = [
        (b"Forwarded", [b"for=192.0.2.60;proto=https"]),
        (b"X-Real-IP", [b"192.0.2.60"]),
        (b"X-Crossbar-Host", [b"gpu-z"]),
        (b"x-crossbar-anything", [b"1"]),
        (b"X-CROSSBAR-ROUTE", [b"r"]),
        (b"X-Crossbarish", [b"not ours"]),
        (b"X-Forwarded-Proto", [b"https"]),
        (b"X-Forwarded-Host", [b"spoofed.example"]),
        (b"Host", [b"crossbar.lab"]),
    ]
    assert lines(headers) == [
        b"X-Crossbarish: not ours",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
        b"X-Forwarded-Host: crossbar.lab",
    ]


def test_a_client_s_forwarded_for_is_replaced_unless_it_is_a_trusted_proxy() -> None:
    headers: Headers = [
        (b"X-Forwarded-For", [b"192.0.2.1, 192.0.2.2", b"192.0.2.3"]),
        (b"Host", [b"crossbar.lab", b"second.lab"]),
    ]
    assert lines(headers, client="::1", secure=True) == [
        b"X-Forwarded-For: ::1",
        b"X-Forwarded-Proto: https",
        b"X-Forwarded-Host: crossbar.lab",
    ]
    assert lines(headers, client="::1", secure=True, trusted=True) == [
        b"X-Forwarded-For: 192.0.2.1, 192.0.2.2, 192.0.2.3, ::1",
        b"X-Forwarded-Proto: https",
        b"X-Forwarded-Host: crossbar.lab",
    ]


def test_without_host_there_is_no_forwarded_host() -> None:
    assert lines([], client="127.0.0.1") == [
        b"X-Forwarded-For: 127.0.0.1",
        b"X-Forwarded-Proto: http",
    ]


def test_header_names_past_the_remembered_ones_are_sorted_all_the_same() -> None:
    """Names are remembered up to a bound; a client sending thousands of new ones still
    gets each line sorted right, and the memory does not grow."""
    many: Headers = [(b"X-N%d" % i, [b"v"]) for i in range(3000)]
    tail: Headers = [
        (b"X-Crossbar-Late", [b"1"]),
        (b"X-Api-Key-Late", [b"2"]),
        (b"X-Api-Key", [b"k"]),
    ]
    out = lines(many + tail)
    assert out[:3000] == [b"X-N%d: v" % i for i in range(3000)]
    assert out[3000:] == [
        b"X-Api-Key-Late: 2",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
    ]
    assert credentials(many + tail) == [b"X-Api-Key: k"]
    assert len(rewrite._KINDS) <= 1024


def test_cr_or_lf_in_a_value_cannot_start_a_header_line() -> None:
    headers: Headers = [
        (b"X-A", [b"one\r\nX-Injected: 1"]),
        (b"X-B", [b"two\nX-Injected: 2"]),
        (b"X-C", [b"three\rX-Injected: 3"]),
        (b"X-Forwarded-For", [b"192.0.2.1\r\nX-Injected: 4"]),
        (b"Host", [b"h\r\nX-Injected: 5"]),
        (b"Authorization", [b"Bearer k\r\nX-Injected: 6"]),
    ]
    out, creds = upstream_headers(headers, "10.1.2.3", False, trusted=True)
    assert out.count(b"\r") == out.count(b"\n") == out.count(b"\r\n") == 6
    assert out.split(b"\r\n") == [
        b"X-A: one  X-Injected: 1",
        b"X-B: two X-Injected: 2",
        b"X-C: three X-Injected: 3",
        b"X-Forwarded-For: 192.0.2.1  X-Injected: 4, 10.1.2.3",
        b"X-Forwarded-Proto: http",
        b"X-Forwarded-Host: h  X-Injected: 5",
        b"",
    ]
    assert creds == b"Authorization: Bearer k  X-Injected: 6\r\n"


@pytest.mark.parametrize(
    ("client", "trusted"),
    [
        ("10.1.2.3", True),
        ("10.2.0.1", False),
        ("192.168.7.7", True),
        ("::ffff:10.1.2.3", True),  # an IPv4 peer on an IPv6 socket
        ("fd00::1", True),
        ("fd01::1", False),
        ("unknown", False),  # no IP address at all (a UNIX socket)
        ("/run/crossbar.sock", False),
    ],
)
def test_trusted_proxy(client: str, trusted: bool) -> None:
    networks = (
        ipaddress.ip_network("10.1.0.0/16"),
        ipaddress.ip_network("192.168.7.7/32"),
        ipaddress.ip_network("fd00::/64"),
    )
    assert trusted_proxy(client, networks) is trusted
    assert trusted_proxy(client, ()) is False


def test_each_host_with_a_key_gets_its_own_authorization_line() -> None:
    config = Config(
        listen="tcp:0",
        hosts={
            "gpu-a": HostConfig("gpu-a", "http://a", api_key=Secret(b"key-a")),
            "gpu-b": HostConfig("gpu-b", "http://b"),
        },
        routes={},
    )
    assert host_keys(config) == {"gpu-a": b"Authorization: Bearer key-a\r\n"}

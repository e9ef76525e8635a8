"""crossbar.server.rewrite: which route a path names, which model a body asks for, and
which header lines cross to the host. Pure rules, called directly."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from crossbar.server.rewrite import (
    BadTarget,
    allowed_path,
    json_body,
    parse_target,
    peek_model,
    printable,
    upstream_headers,
    with_model,
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


@pytest.mark.parametrize("uri", [b"/", b"//x", b"/?a=1", b"", b"http://h/a/v1/x"])
def test_missing_route(uri: bytes) -> None:
    with pytest.raises(BadTarget, match="missing route") as info:
        parse_target(uri)
    assert info.value.status == 400


def test_route_that_is_not_ascii_is_unknown() -> None:
    with pytest.raises(BadTarget, match="unknown route") as info:
        parse_target(b"/caf\xc3\xa9/v1/models")
    assert info.value.status == 404


@pytest.mark.parametrize(
    ("rest", "ok"),
    [
        (b"/v1/chat/completions", True),
        (b"/v1/models", True),
        (b"/health", True),
        (b"/props", True),
        (b"/v1", False),
        (b"/slots", False),
        (b"/metrics", False),
        (b"/health/x", False),
        (b"/models/load", False),
        (b"/", False),
    ],
)
def test_allowed_paths(rest: bytes, ok: bool) -> None:
    assert allowed_path(rest) is ok


def test_peek_model() -> None:
    assert peek_model(b'{"model": "m1", "messages": []}').model == "m1"
    # A "model" inside a message never fools the peek.
    fooled = peek_model(b'{"messages": [{"content": "\\"model\\": \\"evil\\""}], "model": "m2"}')
    assert fooled.model == "m2"
    nested = peek_model(b'{"messages": [{"model": "inner"}]}')
    assert (nested.model, nested.missing) == (None, True)
    for body in (b"not json", b"[1, 2]", b'"model"', b"", b"{broken"):
        assert (peek_model(body).model, peek_model(body).missing) == (None, False)
    for body in (b'{"model": null}', b'{"model": ""}', b'{"model": 3}'):
        assert (peek_model(body).model, peek_model(body).missing) == (None, False)


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "hi"}]}',
        b'  {\n  "stream": true\n}\n',
        b"{}",
        b"{ }",
    ],
)
def test_with_model_keeps_every_other_byte(body: bytes) -> None:
    out = with_model(body, "qwen")
    doc = json.loads(out)
    assert doc["model"] == "qwen"
    original = json.loads(body)
    assert {k: v for k, v in doc.items() if k != "model"} == original
    assert out.replace(b'"model":"qwen",', b"").replace(b'"model":"qwen"', b"") == body


def test_with_model_escapes_the_name() -> None:
    assert with_model(b"{}", 'a"b') == b'{"model":"a\\"b"}'


# -- json_body --------------------------------------------------------------------------------


def test_json_body_is_compact() -> None:
    body = json_body({"error": "upstream timeout", "host": "gpu-a", "n": [1, 2]})
    assert body == b'{"error":"upstream timeout","host":"gpu-a","n":[1,2]}'


def test_json_body_is_ascii() -> None:
    assert json_body({"error": "caf\u00e9"}) == b'{"error":"caf\\u00e9"}'


# -- upstream_headers -------------------------------------------------------------------------


def lines(headers: Headers, client: str = "10.1.2.3", secure: bool = False) -> list[bytes]:
    """The header lines for the host, each without its CRLF."""
    out = upstream_headers(headers, client, secure)
    assert out.endswith(b"\r\n")
    return out[:-2].split(b"\r\n")


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
        b"Authorization: Bearer k",
        b"X-Trace:  a b ",
        b"Accept: */*",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
        b"X-Forwarded-Host: crossbar.lab:8080",
    ]


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


def test_headers_named_in_connection_are_dropped_whatever_their_case() -> None:
    headers: Headers = [
        (b"Connection", [b"close, X-Secret ", b"x-other"]),
        (b"x-secret", [b"s"]),
        (b"X-OTHER", [b"o"]),
        (b"X-Kept", [b"k"]),
    ]
    assert lines(headers) == [
        b"X-Kept: k",
        b"X-Forwarded-For: 10.1.2.3",
        b"X-Forwarded-Proto: http",
    ]


def test_client_forwarded_for_is_extended_and_the_others_are_replaced() -> None:
    headers: Headers = [
        (b"X-Forwarded-For", [b"192.0.2.1, 192.0.2.2", b"192.0.2.3"]),
        (b"X-Forwarded-Proto", [b"http"]),
        (b"X-Forwarded-Host", [b"spoofed.example"]),
        (b"Host", [b"crossbar.lab", b"second.lab"]),
    ]
    assert lines(headers, client="::1", secure=True) == [
        b"X-Forwarded-For: 192.0.2.1, 192.0.2.2, 192.0.2.3, ::1",
        b"X-Forwarded-Proto: https",
        b"X-Forwarded-Host: crossbar.lab",
    ]


def test_without_host_there_is_no_forwarded_host() -> None:
    assert lines([], client="127.0.0.1") == [
        b"X-Forwarded-For: 127.0.0.1",
        b"X-Forwarded-Proto: http",
    ]


def test_cr_or_lf_in_a_value_cannot_start_a_header_line() -> None:
    headers: Headers = [
        (b"X-A", [b"one\r\nX-Injected: 1"]),
        (b"X-B", [b"two\nX-Injected: 2"]),
        (b"X-C", [b"three\rX-Injected: 3"]),
        (b"X-Forwarded-For", [b"192.0.2.1\r\nX-Injected: 4"]),
        (b"Host", [b"h\r\nX-Injected: 5"]),
    ]
    out = upstream_headers(headers, "10.1.2.3", False)
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


@pytest.mark.parametrize(
    ("raw", "limit", "text"),
    [
        (b"/opencdoe/v1/chat/completions", 200, "/opencdoe/v1/chat/completions"),
        (b"/a\x00b\xff\r\n c", 200, "/a\\x00b\\xff\\x0d\\x0a\\x20c"),
        (b"/" + b"x" * 300, 20, "/" + "x" * 16 + "..."),
        (b"\x01" * 300, 20, "\\x01" * 4 + "\\..."),
        (b"", 10, ""),
    ],
)
def test_printable_makes_one_log_line_of_anything(raw: bytes, limit: int, text: str) -> None:
    assert printable(raw, limit) == text

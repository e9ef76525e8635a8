"""crossbar.http.admission: the front door's pure rules, each on its own. How a refusal
reaches the client (its bytes, the connection's end) is tested in test_site."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossbar.http import admission as door
from crossbar.http.admission import (
    DOT_SEGMENT,
    NO_HOST,
    NOT_ALLOWED,
    SEVERAL_HOSTS,
    dot_segment,
    folded,
    hygiene,
    several_hosts,
)

CHAT = b"/lab/v1/chat/completions"


@pytest.mark.parametrize("line", [b" continued", b"\tcontinued", b" ", b"\t", b"  X: y"])
def test_a_line_starting_with_a_space_or_tab_is_folded(line: bytes) -> None:
    assert folded(line)


@pytest.mark.parametrize(
    "line", [b"", b"Host: a", b"X-Thing:  spaced ", b"POST /lab/v1/chat HTTP/1.1", b"\x0bx"]
)
def test_any_other_line_is_not(line: bytes) -> None:
    # The empty line ends the head (and one before the request line is allowed).
    assert not folded(line)


@pytest.mark.parametrize(
    "line",
    [
        b"Transfer-Encoding: identity",
        b"transfer-encoding: IDENTITY",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: chunked, chunked",
        b"Transfer-Encoding: chunked;x=1",
        b"Transfer-Encoding: xchunked",
        b"Transfer-Encoding:",
        b"Transfer-Encoding: chunked\x0b",
    ],
)
def test_a_transfer_encoding_other_than_chunked_alone_is_refused(line: bytes) -> None:
    assert door.not_chunked(line)


@pytest.mark.parametrize(
    "line",
    [
        b"Transfer-Encoding: chunked",
        b"transfer-encoding:Chunked",
        b"Transfer-Encoding: \tCHUNKED ",
        b"Transfer-Encodings: identity",
        b"Content-Length: 2",
        b"X-Transfer-Encoding: identity",
    ],
)
def test_chunked_and_other_headers_pass(line: bytes) -> None:
    assert not door.not_chunked(line)


@pytest.mark.parametrize(
    ("hosts", "several"),
    [(None, False), ([b"a"], False), ([b""], False), ([b"a", b"a"], True), ([b"a", b"b"], True)],
)
def test_two_host_headers_are_several_even_when_they_agree(
    hosts: list[bytes] | None, several: bool
) -> None:
    assert several_hosts(hosts) is several


@pytest.mark.parametrize(
    "path",
    [
        b"/lab/..",
        b"/lab/../other/v1/models",
        b"/lab/v1/../../admin",
        b"/lab/./v1/models",
        b"/lab/v1/.",
        b"/lab/%2e%2e/x",
        b"/lab/%2E%2e/x",
        b"/lab/.%2E/x",
        b"/lab/%2e/x",
        b"/lab/v1%2f..%2fadmin",
        b"/lab/v1%2F..%2Fadmin",
        b"/lab/v1\\..\\admin",
        b"/lab/v1%5c..%5cadmin",
        b"/lab/%252e%252e/x",
        b"/lab/..;x=1/admin",
        b"/lab/v1/%2e%2e;/admin",
        b"//lab/../x",
    ],
)
def test_a_dot_segment_after_the_route_is_found_however_it_is_spelled(path: bytes) -> None:
    assert dot_segment(path)


@pytest.mark.parametrize(
    "path",
    [
        CHAT,
        b"/lab/v1/models",
        b"/lab/v1/models/org%2Fqwen3-coder-30b",
        b"/lab/v1/models/qwen2.5-coder",
        b"/lab/v1/models/a..b",
        b"/lab/v1/.hidden",
        b"/lab/v1/...",
        b"/lab/v1/%2e%2e%2e",
        b"/lab/v1\\models",
        b"/lab/100%25",
        b"/lab",
        b"/",
        b"*",
        b"/../v1/models",
        b"/./v1/models",
    ],
)
def test_other_paths_are_not_climbing(path: bytes) -> None:
    # The route segment itself is a name (route names may hold dots), never decoded; an
    # unknown one is the proxy's 404.
    assert not dot_segment(path)


@pytest.mark.parametrize("method", [b"GET", b"HEAD", b"POST", b"DELETE", b"OPTIONS"])
def test_the_methods_of_an_openai_api_come_in(method: bytes) -> None:
    assert hygiene(method, CHAT, [b"crossbar:7777"]) is None


@pytest.mark.parametrize(
    "method", [b"PUT", b"PATCH", b"TRACE", b"CONNECT", b"PROPFIND", b"get", b"Post", b"-"]
)
def test_any_other_method_is_405_with_the_allowed_ones(method: bytes) -> None:
    refusal = hygiene(method, CHAT, [b"a"])
    assert refusal == NOT_ALLOWED
    assert refusal.status == 405 and refusal.error == "method not allowed"
    assert dict(refusal.headers) == {b"Allow": b"GET, HEAD, POST, DELETE, OPTIONS"}


def test_hygiene_refuses_two_hosts_and_a_dot_segment_with_400() -> None:
    assert hygiene(b"POST", CHAT, [b"a", b"b"]) == SEVERAL_HOSTS
    assert hygiene(b"POST", b"/lab/v1/../x", [b"a"]) == DOT_SEGMENT
    assert hygiene(b"POST", CHAT, None) == NO_HOST  # HTTP/1.1 must name its host
    assert hygiene(b"POST", CHAT, None, b"HTTP/1.0") is None
    for refusal in (SEVERAL_HOSTS, DOT_SEGMENT, door.FOLDED, door.BAD_REQUEST):
        assert refusal.status == 400 and refusal.close


def test_two_hosts_are_decided_before_the_method_and_the_path() -> None:
    # What follows a head with two hosts cannot be trusted: the close rules first.
    assert hygiene(b"PUT", b"/lab/../x", [b"a", b"b"]) == SEVERAL_HOSTS
    assert hygiene(b"PUT", b"/lab/../x", [b"a"]) == NOT_ALLOWED


def test_the_limits_answers_are_in_words() -> None:
    assert (door.TOO_LARGE.status, door.TOO_LARGE.error) == (413, "body too large")
    assert (door.BUSY.status, door.BUSY.error) == (503, "busy")
    assert dict(door.BUSY.headers) == {b"Retry-After": b"1"}
    assert (door.BODY_TOO_SLOW.status, door.BODY_TOO_SLOW.error) == (408, "request body too slow")


def test_a_refusal_on_the_wire_is_json_with_its_length_and_the_connection_s_end() -> None:
    assert door.answer(NOT_ALLOWED) == (
        b"HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json\r\n"
        b"Content-Length: 84\r\nConnection: close\r\nAllow: GET, HEAD, POST, DELETE, OPTIONS\r\n"
        b'\r\n{"error":{"message":"method not allowed","type":"invalid_request_error","code":405}}'
    )
    # To a HEAD: the same head, no body.
    head = door.answer(NOT_ALLOWED, head_only=True)
    assert head == door.answer(NOT_ALLOWED).partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
    odd = door.answer(door.Refusal(429, 'too "many"'), path=b"/_crossbar/status")
    assert odd.startswith(b"HTTP/1.1 429 Refused\r\n")
    assert odd.endswith(b'\r\n\r\n{"error":"too \\"many\\""}')


@pytest.mark.parametrize(
    ("path", "hosts", "refusal"),
    [
        (b"/_crossbar/status", [b"crossbar:7777"], None),
        (b"/_crossbar/status", [b"[::1]:7777"], None),
        (b"/_crossbar/status", [b"gpu-\xc3\xa9.lab"], None),  # a UTF-8 name IDNA can encode
        (b"/_crossbar/status", None, None),
        (b"/_crossbar/livez", [b"a..b"], door.BAD_HOST),
        (b"/_crossbar/livez", [b"a" * 64 + b":80"], door.BAD_HOST),
        (b"/_crossbar/livez", [b"\xff"], door.BAD_HOST),
        (b"/_crossbar/\xa9", [b"127.0.0.1"], door.NOT_UTF8),
        (b"/_crossbar/%a9", [b"127.0.0.1"], door.NOT_UTF8),
        (b"/_crossbar/%c3%a9", [b"127.0.0.1"], None),
    ],
)
def test_what_the_pages_cannot_read_is_refused(
    path: bytes, hosts: list[bytes] | None, refusal: door.Refusal | None
) -> None:
    assert door.unreadable_page(path, hosts) == refusal


_DOT = st.sampled_from([b".", b"%2e", b"%2E", b"%252e"])
_PLAIN = st.binary(min_size=1, max_size=8).filter(
    lambda b: not {ord("/"), ord("\\"), ord("%"), ord("."), ord(";")} & set(b)
)


@settings(max_examples=500, deadline=None)
@given(
    before=st.lists(_PLAIN, max_size=3),
    dots=st.lists(_DOT, min_size=1, max_size=2),
    after=st.lists(_PLAIN, max_size=3),
    slash=st.sampled_from([b"/", b"%2f", b"%2F", b"\\", b"%5c"]),
)
def test_a_dot_segment_is_found_however_it_is_spelled(
    before: list[bytes], dots: list[bytes], after: list[bytes], slash: bytes
) -> None:
    """Any ``.`` or ``..`` segment after the route, each dot and the slash before it in
    any spelling a host might decode, is refused; the same path without it is not."""
    dot = b"".join(dots)
    path = b"/route/" + b"/".join(before) + (slash if before else b"") + dot
    path += b"".join(b"/" + part for part in after)
    assert door.dot_segment(path)
    assert not door.dot_segment(b"/route/" + b"/".join([*before, *after]))

"""The parser of the hosts' answers (:mod:`crossbar.upstream.parsing`), in the style of h11's
tests: a corpus of good answers and one of bad answers, each fed whole, split in two at
every position, and one byte at a time, must give the same events (or be refused) every
time. No Twisted: the parser is fed bytes and records what it reports."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import pytest

from crossbar.upstream import parsing
from crossbar.upstream.parsing import (
    MAX_HEAD,
    MAX_INTERIM,
    MAX_TRAILERS,
    AnswerParser,
    BadAnswer,
    Head,
)

CRLF = b"\r\n"


def answer(start: bytes, *headers: bytes, body: bytes = b"") -> bytes:
    """An answer's bytes: status line, header lines, blank line, body as given."""
    return start + CRLF + b"".join(h + CRLF for h in headers) + CRLF + body


def chunks(*data: bytes, ext: bytes = b"", trailers: Sequence[bytes] = ()) -> bytes:
    """A chunked body carrying ``data``, each chunk (and the last) with extension ``ext``."""
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(d), ext, d) for d in data)
    return body + b"0" + ext + CRLF + b"".join(t + CRLF for t in trailers) + CRLF


def sse(n: int) -> list[bytes]:
    return [b'data: {"choices":[{"delta":{"content":"tok%d"}}]}\n\n' % i for i in range(n)]


TE_CHUNKED = b"Transfer-Encoding: chunked"


@attrs.define
class Record:
    """What a parser reported for one answer, in order."""

    heads: list[Head] = attrs.Factory(list)
    body: bytearray = attrs.Factory(bytearray)
    ends: list[bytes] = attrs.Factory(list)
    order: list[str] = attrs.Factory(list)
    after: bytes = b""  # bytes of later feeds refused as "bytes after the answer"
    error: str | None = None
    closed: bool | None = None

    def on_head(self, head: Head) -> None:
        self.heads.append(head)
        self.order.append("head")

    def on_body(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        assert data, "on_body must never be given empty bytes"
        self.body += data
        if self.order[-1:] != ["body"]:
            self.order.append("body")

    def on_end(self, extra: bytes) -> None:
        self.ends.append(extra)
        self.order.append("end")

    @property
    def extra(self) -> bytes:
        """The bytes after the answer, whether they came with its end or in a later feed."""
        return b"".join(self.ends) + self.after

    def outcome(self) -> tuple[object, ...]:
        return (self.heads, bytes(self.body), len(self.ends), self.extra, self.error, self.closed)


def play(pieces: Iterable[bytes], head_only: bool = False) -> Record:
    """Feed ``pieces`` to a fresh parser expecting one answer; then report the close."""
    record = Record()
    parser = AnswerParser(record.on_head, record.on_body, record.on_end)
    parser.expect(head_only)
    for piece in pieces:
        try:
            parser.feed(piece)
        except BadAnswer as e:
            if record.ends and str(e) == "bytes after the answer":
                record.after += piece
                continue
            record.error = str(e)
            break
    if record.error is None:
        record.closed = parser.closed()
    for head in record.heads:
        assert_clean(head)
    return record


def assert_clean(head: Head) -> None:
    assert b"\r" not in head.phrase and b"\n" not in head.phrase
    for name, value in head.headers:
        for text in (name, value):
            assert b"\r" not in text and b"\n" not in text


def positions(data: bytes) -> list[int]:
    """Every split position, or for large answers those near their ends and head, and
    a sample between (feeding a 100 KB answer 100,000 times over takes minutes)."""
    n = len(data)
    if n <= 4096:
        return list(range(n + 1))
    head_end = data.find(b"\r\n\r\n")
    near = range(max(0, head_end - 40), min(n, head_end + 40))
    return sorted({*range(300), *range(n - 300, n + 1), *range(0, n, 509), *near})


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# -- good answers -----------------------------------------------------------------------------


@attrs.frozen
class Good:
    id: str
    data: bytes
    head: Head
    body: bytes = b""
    extra: bytes = b""
    head_only: bool = False
    until_close: bool = False  # the body ends with the connection: no on_end, closed() True


SSE_EVENTS = sse(30)
BIG_CHUNK = b"line one\r\n\r\nline two\n\n" * 4000  # holds many blank lines: places to cut
LONG_VALUE = b"v" * (MAX_HEAD - len(b"HTTP/1.1 200 OK\r\nX-Long: \r\nContent-Length: 0\r\n\r\n"))
NEAR_LIMIT_TRAILERS = [b"X-T%05d: %s" % (i, b"t" * 50) for i in range(MAX_TRAILERS // 64)]

GOOD = [
    Good(
        "content-length",
        answer(
            b"HTTP/1.1 200 OK", b"Content-Type: text/plain", b"Content-Length: 5", body=b"hello"
        ),
        Head(200, b"OK", [(b"Content-Type", b"text/plain"), (b"Content-Length", b"5")], 5, True),
        b"hello",
    ),
    Good(
        "content-length-zero",
        answer(b"HTTP/1.1 200 OK", b"Content-Length: 0"),
        Head(200, b"OK", [(b"Content-Length", b"0")], 0, True),
    ),
    Good(
        "content-length-leading-zeros",
        answer(b"HTTP/1.1 200 OK", b"Content-Length: 007", body=b"1234567"),
        Head(200, b"OK", [(b"Content-Length", b"007")], 7, True),
        b"1234567",
    ),
    Good(
        "chunked",
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(b"hello", b" world")),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"hello world",
    ),
    Good(
        "chunked-extensions-and-trailers",
        answer(
            b"HTTP/1.1 200 OK",
            TE_CHUNKED,
            body=chunks(
                b"abc", b"defg", ext=b';name=value;q="a;b:c"', trailers=[b"Expires: 0", b"X-T: 1"]
            ),
        ),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"abcdefg",
    ),
    Good(
        "sse-chunks",
        answer(
            b"HTTP/1.1 200 OK",
            b"Content-Type: text/event-stream",
            b"Cache-Control: no-cache",
            TE_CHUNKED,
            body=chunks(*SSE_EVENTS),
        ),
        Head(
            200,
            b"OK",
            [
                (b"Content-Type", b"text/event-stream"),
                (b"Cache-Control", b"no-cache"),
                (b"Transfer-Encoding", b"chunked"),
            ],
            None,
            True,
        ),
        b"".join(SSE_EVENTS),
    ),
    Good(
        "sse-crlf-events",  # blank lines inside the chunks: the parser cuts there and goes on
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(b"data: 1\r\n\r\n", b"\r\n\r\n", b"\n")),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"data: 1\r\n\r\n\r\n\r\n\n",
    ),
    Good(
        "large-single-chunk",
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(BIG_CHUNK)),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        BIG_CHUNK,
    ),
    Good(
        "chunked-codings-and-case",
        answer(
            b"HTTP/1.1 200 OK",
            b"transfer-encoding: gzip, CHUNKED",
            body=b"0000A\r\n0123456789\r\n0\r\n\r\n",
        ),
        Head(200, b"OK", [(b"transfer-encoding", b"gzip, CHUNKED")], None, True),
        b"0123456789",
    ),
    Good(
        "two-transfer-encoding-headers",
        answer(b"HTTP/1.1 200 OK", b"Transfer-Encoding: gzip", TE_CHUNKED, body=chunks(b"z")),
        Head(
            200,
            b"OK",
            [(b"Transfer-Encoding", b"gzip"), (b"Transfer-Encoding", b"chunked")],
            None,
            True,
        ),
        b"z",
    ),
    Good(
        "until-close-http-1.1",
        answer(b"HTTP/1.1 200 OK", b"Content-Type: text/plain", body=b"streamed until the end"),
        Head(200, b"OK", [(b"Content-Type", b"text/plain")], None, False),
        b"streamed until the end",
        until_close=True,
    ),
    Good(
        "until-close-http-1.0",
        answer(b"HTTP/1.0 200 OK", body=b"old\r\n\r\nschool"),
        Head(200, b"OK", [], None, False),
        b"old\r\n\r\nschool",
        until_close=True,
    ),
    Good(
        "until-close-keep-alive-asked",  # no length: the close ends it, whatever was asked
        answer(b"HTTP/1.0 200 OK", b"Connection: keep-alive", body=b"x"),
        Head(200, b"OK", [(b"Connection", b"keep-alive")], None, False),
        b"x",
        until_close=True,
    ),
    Good(
        "http-1.0-keep-alive",
        answer(b"HTTP/1.0 200 OK", b"Connection: Keep-Alive", b"Content-Length: 2", body=b"ok"),
        Head(200, b"OK", [(b"Connection", b"Keep-Alive"), (b"Content-Length", b"2")], 2, True),
        b"ok",
    ),
    Good(
        "http-1.0-not-kept-alive",
        answer(b"HTTP/1.0 200 OK", b"Content-Length: 2", body=b"ok"),
        Head(200, b"OK", [(b"Content-Length", b"2")], 2, False),
        b"ok",
    ),
    Good(
        "http-1.0-keep-alive-and-close",  # llhttp alone would keep this one alive
        answer(b"HTTP/1.0 200 OK", b"Connection: keep-alive, close", b"Content-Length: 0"),
        Head(
            200, b"OK", [(b"Connection", b"keep-alive, close"), (b"Content-Length", b"0")], 0, False
        ),
    ),
    Good(
        "connection-close",
        answer(
            b"HTTP/1.1 200 OK",
            b"Connection: Upgrade-Insecure,Close",
            b"Content-Length: 1",
            body=b"!",
        ),
        Head(
            200,
            b"OK",
            [(b"Connection", b"Upgrade-Insecure,Close"), (b"Content-Length", b"1")],
            1,
            False,
        ),
        b"!",
    ),
    Good(
        "100-continue",
        answer(b"HTTP/1.1 100 Continue")
        + answer(b"HTTP/1.1 200 OK", b"Content-Length: 1", body=b"x"),
        Head(200, b"OK", [(b"Content-Length", b"1")], 1, True),
        b"x",
    ),
    Good(
        "103-early-hints",
        answer(b"HTTP/1.1 103 Early Hints", b"Link: </a.css>; rel=preload")
        + answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(b"final")),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"final",
    ),
    Good(
        "several-interims",
        answer(b"HTTP/1.1 100 Continue")
        + answer(b"HTTP/1.1 102 Processing")
        + answer(b"HTTP/1.1 103 Early Hints", b"Link: <x>")
        + answer(b"HTTP/1.0 150 Unknown 1xx", b"Content-Length: 0")
        + answer(b"HTTP/1.1 201 Created", b"Location: /x", b"Content-Length: 0"),
        Head(201, b"Created", [(b"Location", b"/x"), (b"Content-Length", b"0")], 0, True),
    ),
    Good(
        "interims-up-to-the-count",
        answer(b"HTTP/1.1 100 Continue") * 10 + answer(b"HTTP/1.1 200 OK", b"Content-Length: 0"),
        Head(200, b"OK", [(b"Content-Length", b"0")], 0, True),
    ),
    Good(
        "204",
        answer(b"HTTP/1.1 204 No Content", b"Date: Mon, 01 Jan 2024 00:00:00 GMT"),
        Head(204, b"No Content", [(b"Date", b"Mon, 01 Jan 2024 00:00:00 GMT")], None, True),
    ),
    Good(
        "304-with-length",  # the length a 200 would have had; no body follows
        answer(b"HTTP/1.1 304 Not Modified", b'ETag: "1"', b"Content-Length: 42"),
        Head(304, b"Not Modified", [(b"ETag", b'"1"'), (b"Content-Length", b"42")], 42, True),
    ),
    Good(
        "304-chunked",
        answer(b"HTTP/1.1 304 Not Modified", TE_CHUNKED),
        Head(304, b"Not Modified", [(b"Transfer-Encoding", b"chunked")], None, True),
    ),
    Good(
        "head-with-length",
        answer(b"HTTP/1.1 200 OK", b"Content-Length: 1234"),
        Head(200, b"OK", [(b"Content-Length", b"1234")], 1234, True),
        head_only=True,
    ),
    Good(
        "head-chunked",
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        head_only=True,
    ),
    Good(
        "head-no-length",
        answer(b"HTTP/1.1 200 OK", b"Content-Type: text/html"),
        Head(200, b"OK", [(b"Content-Type", b"text/html")], None, True),
        head_only=True,
    ),
    Good(
        "values-with-spaces",
        answer(
            b"HTTP/1.1 200 OK",
            b"X-A:   two  words \t",
            b"X-B:\tx\ty\t",
            b"X-Empty:",
            b"X-Spaces:    ",
            b"Content-Length: 0",
        ),
        Head(
            200,
            b"OK",
            [
                (b"X-A", b"two  words"),
                (b"X-B", b"x\ty"),
                (b"X-Empty", b""),
                (b"X-Spaces", b""),
                (b"Content-Length", b"0"),
            ],
            0,
            True,
        ),
    ),
    Good(
        "repeated-headers-in-order",
        answer(
            b"HTTP/1.1 200 OK",
            b"Set-Cookie: a=1",
            b"Vary: Accept",
            b"set-cookie: b=2",
            b"SET-COOKIE: c=3",
            b"Content-Length: 0",
        ),
        Head(
            200,
            b"OK",
            [
                (b"Set-Cookie", b"a=1"),
                (b"Vary", b"Accept"),
                (b"set-cookie", b"b=2"),
                (b"SET-COOKIE", b"c=3"),
                (b"Content-Length", b"0"),
            ],
            0,
            True,
        ),
    ),
    Good(
        "empty-phrase",
        answer(b"HTTP/1.1 500 ", b"Content-Length: 3", body=b"err"),
        Head(500, b"", [(b"Content-Length", b"3")], 3, True),
        b"err",
    ),
    Good(
        "no-phrase",
        answer(b"HTTP/1.1 404", b"Content-Length: 4", body=b"nope"),
        Head(404, b"", [(b"Content-Length", b"4")], 4, True),
        b"nope",
    ),
    Good(
        "utf8-phrase-and-value",
        answer(b"HTTP/1.1 599 \xc3\x87a va mal", b"X-Name: caf\xc3\xa9", b"Content-Length: 0"),
        Head(
            599,
            b"\xc3\x87a va mal",
            [(b"X-Name", b"caf\xc3\xa9"), (b"Content-Length", b"0")],
            0,
            True,
        ),
    ),
    Good(
        "bytes-after-length-body",
        answer(b"HTTP/1.1 200 OK", b"Content-Length: 2", body=b"okHTTP/1.1 200 OK\r\n"),
        Head(200, b"OK", [(b"Content-Length", b"2")], 2, True),
        b"ok",
        extra=b"HTTP/1.1 200 OK\r\n",
    ),
    Good(
        "bytes-after-chunked-body",
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(b"abc") + b"junk\r\n\r\nmore"),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"abc",
        extra=b"junk\r\n\r\nmore",
    ),
    Good(
        "blank-line-after-chunked-body",  # llhttp would skip it silently
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(b"abc") + b"\r\n"),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"abc",
        extra=b"\r\n",
    ),
    Good(
        "bytes-after-bodiless-answer",
        answer(b"HTTP/1.1 204 No Content") + b"X",
        Head(204, b"No Content", [], None, True),
        extra=b"X",
    ),
    Good(
        "bytes-after-head-answer",
        answer(b"HTTP/1.1 200 OK", b"Content-Length: 3") + b"abc",
        Head(200, b"OK", [(b"Content-Length", b"3")], 3, True),
        extra=b"abc",
        head_only=True,
    ),
    Good(
        "head-at-the-limit",
        answer(b"HTTP/1.1 200 OK", b"X-Long: " + LONG_VALUE, b"Content-Length: 0"),
        Head(200, b"OK", [(b"X-Long", LONG_VALUE), (b"Content-Length", b"0")], 0, True),
    ),
    Good(
        "trailers-near-the-limit",
        answer(b"HTTP/1.1 200 OK", TE_CHUNKED, body=chunks(b"x", trailers=NEAR_LIMIT_TRAILERS)),
        Head(200, b"OK", [(b"Transfer-Encoding", b"chunked")], None, True),
        b"x",
    ),
]


def expected(case: Good) -> tuple[object, ...]:
    ends = 0 if case.until_close else 1
    return ([case.head], case.body, ends, case.extra, None, case.until_close)


def test_corpora_are_big_enough() -> None:
    assert len(GOOD) >= 20
    assert len(BAD) >= 15
    assert len(positions(GOOD[0].data)) == len(GOOD[0].data) + 1


def test_interim_limits_are_the_ones_the_corpora_test() -> None:
    assert MAX_INTERIM == 10
    assert MAX_HEAD // len(EARLY_HINT) + 1 <= MAX_INTERIM  # refused for its size alone


def test_endless_interim_answers_are_refused_after_the_tenth() -> None:
    """A host that answers ``100 Continue`` without end (say 10,000 times) is refused at
    the eleventh, in one feed or in many, before any head is reported."""
    heads: list[Head] = []
    parser = AnswerParser(heads.append, lambda _: None, lambda _: None)
    parser.expect(head_only=False)
    for _ in range(MAX_INTERIM):
        parser.feed(CONTINUE)
    with pytest.raises(BadAnswer, match=r"^more than 10 interim \(1xx\) answers$"):
        parser.feed(CONTINUE)
    parser.expect(head_only=False)
    with pytest.raises(BadAnswer, match="interim"):
        parser.feed(CONTINUE * 10_000)
    assert heads == []


def test_head_at_the_limit_is_exactly_the_limit() -> None:
    case = next(c for c in GOOD if c.id == "head-at-the-limit")
    assert len(case.data) == MAX_HEAD


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_good_answer_whole(case: Good) -> None:
    record = play([case.data], case.head_only)
    assert record.outcome() == expected(case)
    if case.until_close:
        assert record.order == (["head", "body"] if case.body else ["head"])
    else:
        assert record.order == (["head", "body", "end"] if case.body else ["head", "end"])


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_good_answer_split_in_two_anywhere(case: Good) -> None:
    whole = expected(case)
    for i in positions(case.data):
        record = play([case.data[:i], case.data[i:]], case.head_only)
        assert record.outcome() == whole, f"split at {i}"


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_good_answer_one_byte_at_a_time(case: Good) -> None:
    assert play(bytewise(case.data), case.head_only).outcome() == expected(case)


# -- bad answers ------------------------------------------------------------------------------


@attrs.frozen
class Bad:
    id: str
    data: bytes
    reason: str  # in str(BadAnswer) when fed whole
    head_only: bool = False


OK = b"HTTP/1.1 200 OK"
CL0 = b"Content-Length: 0"
BIG_TRAILER = b"X-Big: " + b"b" * MAX_TRAILERS
MANY_TRAILERS = [b"X-T%05d: %s" % (i, b"t" * 40) for i in range(MAX_TRAILERS // 40)]
EARLY_HINT = answer(b"HTTP/1.1 103 Early Hints", b"Link: <" + b"l" * 8000 + b">")
CONTINUE = answer(b"HTTP/1.1 100 Continue")

BAD = [
    Bad(
        "cl-then-te", answer(OK, b"Content-Length: 3", TE_CHUNKED, body=chunks(b"abc")), "Transfer"
    ),
    Bad("te-then-cl", answer(OK, TE_CHUNKED, b"Content-Length: 3", body=chunks(b"abc")), "Content"),
    Bad("te-gzip", answer(OK, b"Transfer-Encoding: gzip", body=b"abc"), "unsupported Transfer"),
    Bad("te-identity", answer(OK, b"Transfer-Encoding: identity", body=b"abc"), "unsupported"),
    Bad(
        "te-chunked-gzip", answer(OK, b"Transfer-Encoding: chunked, gzip", body=b"x"), "unsupported"
    ),
    Bad("te-chunked-twice", answer(OK, TE_CHUNKED, TE_CHUNKED, body=chunks(b"a")), "unsupported"),
    Bad("te-chunked-chunked", answer(OK, b"Transfer-Encoding: chunked, chunked"), "unsupported"),
    Bad(
        "te-chunked-params", answer(OK, b"Transfer-Encoding: chunked;q=1", body=b"x"), "unsupported"
    ),
    # llhttp reads these as some other coding, and the body as raw bytes until the close
    Bad("te-chunked-tab", answer(OK, TE_CHUNKED + b"\t", body=chunks(b"a")), "unsupported"),
    Bad(
        "te-chunked-comma",
        answer(OK, b"Transfer-Encoding: chunked,", body=chunks(b"a")),
        "unsupported",
    ),
    Bad("te-last-header-empty", answer(OK, TE_CHUNKED, b"Transfer-Encoding: ,"), "unsupported"),
    Bad("te-in-http-1.0", answer(b"HTTP/1.0 200 OK", TE_CHUNKED, body=chunks(b"a")), "HTTP/1.0"),
    Bad("cl-sign", answer(OK, b"Content-Length: +5", body=b"hello"), "Content-Length"),
    Bad("cl-hex", answer(OK, b"Content-Length: 0x5", body=b"hello"), "Content-Length"),
    Bad("cl-word", answer(OK, b"Content-Length: five", body=b"hello"), "Content-Length"),
    Bad("cl-empty", answer(OK, b"Content-Length:", body=b"hello"), "Content-Length"),
    Bad("cl-list", answer(OK, b"Content-Length: 5, 5", body=b"hello"), "Content-Length"),
    Bad("cl-overflow", answer(OK, b"Content-Length: 99999999999999999999999"), "overflow"),
    Bad("cl-two-values", answer(OK, b"Content-Length: 5", b"Content-Length: 6"), "Duplicate"),
    Bad("cl-repeated", answer(OK, b"Content-Length: 5", b"Content-Length: 5"), "Duplicate"),
    Bad("status-099", answer(b"HTTP/1.1 099 Low", CL0), "status code out of range"),
    Bad("status-999", answer(b"HTTP/1.1 999 High", CL0), "status code out of range"),
    Bad("status-600", answer(b"HTTP/1.1 600 High", CL0), "status code out of range"),
    Bad("status-101", answer(b"HTTP/1.1 101 Switching Protocols") + b"\x00\x01", "protocol switch"),
    Bad(
        "status-101-upgrade",
        answer(b"HTTP/1.1 101 Switching Protocols", b"Upgrade: websocket", b"Connection: Upgrade"),
        "protocol switch",
    ),
    Bad("status-four-digits", answer(b"HTTP/1.1 2000 OK", CL0), "status"),
    Bad("status-two-digits", answer(b"HTTP/1.1 20 OK", CL0), "status"),
    Bad("status-missing", answer(b"HTTP/1.1 OK", CL0), "status"),
    Bad("status-two-spaces", answer(b"HTTP/1.1  200 OK", CL0), "status"),
    Bad("http-2.0", answer(b"HTTP/2.0 200 OK", CL0), "not HTTP/1.1"),
    Bad("http-0.9", answer(b"HTTP/0.9 200 OK", CL0), "not HTTP/1.1"),
    Bad("http-1.2", answer(b"HTTP/1.2 200 OK", CL0), "version"),
    Bad("rtsp", answer(b"RTSP/1.0 200 OK", CL0), "not an HTTP answer"),
    Bad("ice", answer(b"ICE/1.0 200 OK", CL0), "not an HTTP answer"),
    Bad("lowercase-http", answer(b"http/1.1 200 OK", CL0), "not an HTTP answer"),
    Bad("blank-line-first", CRLF + answer(OK, CL0), "not an HTTP answer"),
    Bad("not-http", b"hello world\r\n\r\n", "not an HTTP answer"),
    Bad("header-without-colon", answer(OK, b"X-Broken header", CL0), "header"),
    Bad("space-before-colon", answer(OK, b"Content-Length : 0"), "header"),
    Bad("empty-header-name", answer(OK, b": value", CL0), "header"),
    Bad("space-first-header", answer(OK, b" X: v", CL0), "space"),
    Bad("obs-fold", answer(OK, b"X: a", b" folded", CL0), "whitespace"),
    Bad("phrase-bare-cr", answer(b"HTTP/1.1 200 O\rK", CL0), "LF"),
    Bad("phrase-bare-lf", answer(b"HTTP/1.1 200 O\nK", CL0), "CR"),
    Bad("phrase-injection", answer(b"HTTP/1.1 200 OK\rX-Injected: 1", CL0), "LF"),
    Bad("value-bare-cr", answer(OK, b"X: a\rX-Injected: 1", CL0), "LF"),
    Bad("value-bare-lf", answer(OK, b"X: a\nX-Injected: 1", CL0), "CR"),
    Bad("value-cr-cr-lf", answer(OK, b"X: a\r\r", CL0), "LF"),
    Bad("value-nul", answer(OK, b"X: a\x00b", CL0), "header value"),
    Bad("value-del", answer(OK, b"X: a\x7fb", CL0), "header value"),
    Bad("lf-line-ends", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", "CR"),
    Bad("lf-blank-line", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n", "header"),
    Bad(
        "chunk-size-not-hex", answer(OK, TE_CHUNKED, body=b"g\r\nhello\r\n0\r\n\r\n"), "chunk size"
    ),
    Bad(
        "chunk-size-negative",
        answer(OK, TE_CHUNKED, body=b"-5\r\nhello\r\n0\r\n\r\n"),
        "chunk size",
    ),
    Bad("chunk-size-space", answer(OK, TE_CHUNKED, body=b"5 \r\nhello\r\n0\r\n\r\n"), "chunk size"),
    Bad("chunk-size-empty", answer(OK, TE_CHUNKED, body=b"\r\nhello\r\n0\r\n\r\n"), "chunk size"),
    Bad("chunk-size-overflow", answer(OK, TE_CHUNKED, body=b"f" * 20 + b"\r\nab"), "overflow"),
    Bad("chunk-size-lf", answer(OK, TE_CHUNKED, body=b"5\nhello\r\n0\r\n\r\n"), "CR"),
    Bad("chunk-longer-than-size", answer(OK, TE_CHUNKED, body=b"5\r\nhelloX\r\n0\r\n\r\n"), "LF"),
    Bad("chunk-data-lf", answer(OK, TE_CHUNKED, body=b"5\r\nhello\n0\r\n\r\n"), "CR"),
    Bad("last-chunk-missing", answer(OK, TE_CHUNKED, body=b"5\r\nhello\r\n\r\n"), "chunk size"),
    Bad("last-chunk-lf", answer(OK, TE_CHUNKED, body=b"5\r\nhello\r\n0\n\n"), "CR"),
    Bad("end-lf", answer(OK, TE_CHUNKED, body=b"5\r\nhello\r\n0\r\n\n"), "header"),
    Bad("chunk-extension-empty", answer(OK, TE_CHUNKED, body=b"5;\r\nhello\r\n0\r\n\r\n"), "ext"),
    Bad(
        "chunk-extension-nul", answer(OK, TE_CHUNKED, body=b"5;a\x00\r\nhello\r\n0\r\n\r\n"), "ext"
    ),
    Bad(
        "trailer-without-colon",
        answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=[b"T"])),
        "header",
    ),
    Bad("trailer-bare-cr", answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=[b"T: a\rb"])), "LF"),
    Bad("trailer-cl", answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=[CL0])), "Content-Length"),
    Bad(
        "trailer-over-limit",
        answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=[BIG_TRAILER])),
        "trailers",
    ),
    Bad(
        "trailers-over-limit",
        answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=MANY_TRAILERS)),
        "trailers",
    ),
    Bad("head-over-limit", answer(OK, b"X-Long: " + LONG_VALUE + b"v", CL0), "too long"),
    Bad("head-far-over-limit", answer(OK, b"X-Long: " + b"v" * 200_000, CL0), "too long"),
    Bad(
        "interims-over-limit",  # fewer than MAX_INTERIM, but together too long
        EARLY_HINT * (MAX_HEAD // len(EARLY_HINT) + 1) + answer(OK, CL0),
        "too long",
    ),
    Bad(
        "interims-over-count",
        CONTINUE * (MAX_INTERIM + 1) + answer(OK, CL0),
        "more than 10 interim (1xx) answers",
    ),
    Bad(
        "interim-with-length",
        answer(b"HTTP/1.1 150 Odd", b"Content-Length: 2", body=b"ab"),
        "interim",
    ),
    Bad(
        "interim-chunked",
        answer(b"HTTP/1.1 100 Continue", TE_CHUNKED, body=chunks(b"a")),
        "interim",
    ),
    Bad(
        "head-answer-te-gzip", answer(OK, b"Transfer-Encoding: gzip"), "unsupported", head_only=True
    ),
    Bad("bytes-after-the-answer", answer(OK, b"Content-Length: 1", body=b"xy"), "EXTRA"),
]


def refused(record: Record) -> bool:
    """Whether a caller drops the connection: an error, or bytes after the answer."""
    return record.error is not None or record.extra != b""


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_bad_answer_whole(case: Bad) -> None:
    record = play([case.data], case.head_only)
    if case.reason == "EXTRA":
        assert record.error is None and record.extra == b"y"
    else:
        assert record.error is not None and case.reason in record.error
        assert "\n" not in record.error and "\r" not in record.error
        assert record.ends == []  # never an end for a refused answer


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_bad_answer_split_in_two_anywhere(case: Bad) -> None:
    for i in positions(case.data):
        record = play([case.data[:i], case.data[i:]], case.head_only)
        assert refused(record), f"split at {i}"
        if case.reason != "EXTRA":
            assert record.error is not None and record.ends == [], f"split at {i}"


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_bad_answer_in_small_pieces(case: Bad) -> None:
    size = 1 if len(case.data) <= 8192 else 97  # httptools grows a long header value per piece
    pieces = [case.data[i : i + size] for i in range(0, len(case.data), size)]
    record = play(pieces, case.head_only)
    assert refused(record)
    if case.reason != "EXTRA":
        assert record.error is not None and record.ends == []


# Answers whose head is fine: the fault is in the body, found after on_head.
BODY_FAULTS = {
    *(case.id for case in BAD if case.id.startswith(("chunk-", "last-chunk", "trailer"))),
    "end-lf",
    "bytes-after-the-answer",
}


def test_body_faults_are_known() -> None:
    assert len(BODY_FAULTS) == 19
    assert {case.id for case in BAD} >= BODY_FAULTS


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_a_refused_head_is_never_reported(case: Bad) -> None:
    heads = 1 if case.id in BODY_FAULTS else 0
    assert len(play([case.data], case.head_only).heads) == heads
    for i in positions(case.data):
        assert len(play([case.data[:i], case.data[i:]], case.head_only).heads) == heads, i


# -- limits that are never reached by an end ----------------------------------------------


def never(event: object) -> None:
    pytest.fail(f"unexpected event {event!r}")


def test_an_endless_head_is_refused_at_the_limit() -> None:
    parser = AnswerParser(never, never, never)
    parser.expect(False)
    parser.feed(b"HTTP/1.1 200 OK\r\nX-Endless: ")
    fed = 27
    with pytest.raises(BadAnswer, match="too long"):
        while fed <= 2 * MAX_HEAD:
            fed += 100
            parser.feed(b"e" * 100)
    assert MAX_HEAD < fed <= MAX_HEAD + 100  # refused with the first piece over the limit


def test_an_endless_trailer_is_refused_near_the_limit() -> None:
    record = Record()
    parser = AnswerParser(record.on_head, record.on_body, record.on_end)
    parser.expect(False)
    parser.feed(answer(OK, TE_CHUNKED, body=b"3\r\nabc\r\n0\r\nX-Endless: "))
    fed = 0
    with pytest.raises(BadAnswer, match=r"^trailers or chunk size line too long$"):
        while fed <= 4 * MAX_TRAILERS:
            fed += 1000
            parser.feed(b"t" * 1000)
    # Refused once the bytes since the last body byte pass the limit and 1 KiB of framing.
    assert MAX_TRAILERS + 1024 < fed <= MAX_TRAILERS + 1024 + 1000
    assert bytes(record.body) == b"abc" and record.ends == []


def test_an_endless_chunk_size_line_is_refused() -> None:
    record = Record()
    parser = AnswerParser(record.on_head, record.on_body, record.on_end)
    parser.expect(False)
    parser.feed(answer(OK, TE_CHUNKED, body=b"3\r\nabc\r\n5;ext="))
    fed = 0
    with pytest.raises(BadAnswer, match=r"^trailers or chunk size line too long$"):
        while fed <= 4 * MAX_TRAILERS:
            fed += 1000
            parser.feed(b"x" * 1000)
    assert MAX_TRAILERS < fed <= MAX_TRAILERS + 1024 + 1000
    assert bytes(record.body) == b"abc" and record.ends == []


def test_a_trailer_section_just_over_the_limit_is_refused() -> None:
    # Counted as each trailer's name, value and 3 bytes for ": " and CRLF.
    value = b"v" * (MAX_TRAILERS - len(b"X-Big") - 3)
    fits = answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=[b"X-Big:" + value]))
    assert play([fits]).ends == [b""]
    over = answer(OK, TE_CHUNKED, body=chunks(b"a", trailers=[b"X-Big:" + value + b"v"]))
    assert play([over]).error == "trailers too long"


# -- the parser's life on a kept-alive connection ---------------------------------------------


def make() -> tuple[AnswerParser, Record]:
    record = Record()
    return AnswerParser(record.on_head, record.on_body, record.on_end), record


def test_two_answers_in_a_row() -> None:
    parser, record = make()
    parser.expect(False)
    parser.feed(answer(OK, TE_CHUNKED, body=chunks(b"first")))
    parser.expect(False)
    parser.feed(answer(b"HTTP/1.1 201 Created", b"Content-Length: 6", body=b"second"))
    assert [h.code for h in record.heads] == [200, 201]
    assert bytes(record.body) == b"firstsecond"
    assert record.ends == [b"", b""]
    assert record.order == ["head", "body", "end", "head", "body", "end"]


def test_a_get_after_a_head_on_the_same_parser() -> None:
    parser, record = make()
    parser.expect(True)
    parser.feed(answer(OK, b"Content-Length: 5"))
    # The head ends the answer to a HEAD, so the connection stays usable.
    assert record.ends == [b""] and record.heads[0].length == 5 and record.heads[0].keep_alive
    parser.expect(False)
    parser.feed(answer(OK, b"Content-Length: 5", body=b"hello"))
    assert bytes(record.body) == b"hello" and record.ends == [b"", b""]
    assert record.heads[1].keep_alive


def test_answers_on_one_parser_fed_in_odd_pieces() -> None:
    answers = [
        answer(b"HTTP/1.1 100 Continue") + answer(OK, TE_CHUNKED, body=chunks(*sse(5))),
        answer(OK, b"Content-Length: 3", body=b"abc"),
        answer(b"HTTP/1.1 204 No Content"),
        answer(OK, TE_CHUNKED, body=chunks(b"\r\n\r\n", ext=b";x=1", trailers=[b"T: 1"])),
    ]
    for size in (1, 2, 3, 5, 7, 64):
        parser, record = make()
        for data in answers:
            parser.expect(False)
            for i in range(0, len(data), size):
                parser.feed(data[i : i + size])
        assert [h.code for h in record.heads] == [200, 200, 204, 200]
        assert bytes(record.body) == b"".join(sse(5)) + b"abc" + b"\r\n\r\n"
        assert record.ends == [b""] * 4


def test_on_end_may_expect_the_next_answer() -> None:
    record = Record()
    parser: AnswerParser

    def on_end(extra: bytes) -> None:
        record.on_end(extra)
        parser.expect(False)

    parser = AnswerParser(record.on_head, record.on_body, on_end)
    parser.expect(False)
    parser.feed(answer(OK, b"Content-Length: 1", body=b"a"))
    parser.feed(answer(OK, b"Content-Length: 1", body=b"b"))
    assert bytes(record.body) == b"ab" and record.ends == [b"", b""]


def test_expect_recovers_after_a_refused_answer() -> None:
    parser, record = make()
    parser.expect(False)
    with pytest.raises(BadAnswer):
        parser.feed(answer(OK, b"Transfer-Encoding: gzip"))
    with pytest.raises(BadAnswer, match="bytes after a refused answer"):
        parser.feed(b"more")
    parser.expect(False)
    parser.feed(answer(OK, CL0))
    assert [h.code for h in record.heads] == [200] and record.ends == [b""]


def test_expect_abandons_an_answer_under_way() -> None:
    parser, record = make()
    parser.expect(False)
    parser.feed(answer(OK, b"Content-Length: 10", body=b"abc"))
    parser.expect(False)
    parser.feed(answer(OK, b"Content-Length: 2", body=b"de"))
    assert bytes(record.body) == b"abcde" and record.ends == [b""]


# -- bytes the host was not asked for ----------------------------------------------------------


def test_bytes_after_the_answer_in_a_later_feed_are_refused() -> None:
    parser, record = make()
    parser.expect(False)
    parser.feed(answer(OK, b"Content-Length: 2", body=b"ok"))
    parser.feed(b"")  # nothing is fine
    with pytest.raises(BadAnswer, match=r"^bytes after the answer$"):
        parser.feed(b"H")
    with pytest.raises(BadAnswer, match=r"^bytes after the answer$"):
        parser.feed(b"TTP")
    assert record.ends == [b""]


def test_bytes_before_any_request_are_refused() -> None:
    parser, _ = make()
    parser.feed(b"")
    with pytest.raises(BadAnswer, match="before any request"):
        parser.feed(answer(OK, CL0))


def test_extra_is_exactly_what_follows_a_chunked_end_split_anywhere() -> None:
    data = answer(OK, TE_CHUNKED, body=chunks(b"a\r\n\r\n", trailers=[b"T: 1"])) + b"\r\n\r\nZ"
    for i in range(len(data) + 1):
        record = play([data[:i], data[i:]])
        assert record.extra == b"\r\n\r\nZ", i
        assert bytes(record.body) == b"a\r\n\r\n"


# -- closed() ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fed", "head_only", "completes"),
    [
        (answer(OK, body=b"part of a body"), False, True),
        (answer(OK), False, True),  # an empty body, ended by the close
        (answer(b"HTTP/1.0 200 OK", body=b"x"), False, True),
        (answer(OK, b"Content-Length: 10", body=b"short"), False, False),
        (answer(OK, TE_CHUNKED, body=b"5\r\nhello\r\n"), False, False),
        (answer(OK, TE_CHUNKED, body=b"5\r\nhello\r\n0\r\n"), False, False),
        (answer(OK, TE_CHUNKED), False, False),
        (b"HTTP/1.1 200 OK\r\nContent-Le", False, False),
        (answer(b"HTTP/1.1 100 Continue"), False, False),
        (b"", False, False),
        (answer(OK, CL0), False, False),  # complete already: on_end said so
        (answer(OK), True, False),  # a HEAD answer ends with its head
    ],
)
def test_closed(fed: bytes, head_only: bool, completes: bool) -> None:
    parser, record = make()
    parser.expect(head_only)
    parser.feed(fed)
    ends = list(record.ends)
    assert parser.closed() is completes
    assert record.ends == ends  # closed() never reports an end itself
    with pytest.raises(BadAnswer, match="bytes after the answer"):
        parser.feed(b"x")
    assert parser.closed() is False


def test_closed_before_any_request() -> None:
    parser, _ = make()
    assert parser.closed() is False


# -- callbacks ---------------------------------------------------------------------------------


class Boom(Exception):
    pass


def boom(_: object) -> None:
    raise Boom


@pytest.mark.parametrize(
    "data",
    [
        answer(OK, TE_CHUNKED, body=chunks(b"abc")),
        answer(OK, b"Content-Length: 3", body=b"abc"),
        answer(OK, body=b"abc"),
    ],
    ids=["chunked", "length", "until-close"],
)
def test_an_exception_from_on_body_comes_out_unchanged(data: bytes) -> None:
    parser = AnswerParser(lambda head: None, boom, never)
    parser.expect(False)
    with pytest.raises(Boom):
        parser.feed(data)
    with pytest.raises(BadAnswer, match="refused"):
        parser.feed(b"more")


def test_an_exception_from_on_head_comes_out_unchanged() -> None:
    parser = AnswerParser(boom, never, never)
    parser.expect(False)
    with pytest.raises(Boom):
        parser.feed(answer(OK, b"Content-Length: 3", body=b"abc"))
    with pytest.raises(BadAnswer, match="refused"):
        parser.feed(b"abc")


def test_chunked_bodies_come_as_their_chunks() -> None:
    pieces: list[bytes] = []
    parser = AnswerParser(lambda head: None, pieces.append, lambda extra: None)
    parser.expect(False)
    parser.feed(answer(OK, TE_CHUNKED))
    for event in sse(3):
        parser.feed(b"%x\r\n%s\r\n" % (len(event), event))
    assert pieces == sse(3)


def test_head_is_frozen() -> None:
    head = play([answer(OK, CL0)]).heads[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        head.code = 500  # type: ignore[misc]


def test_the_module_imports_no_twisted() -> None:
    tree = ast.parse(Path(parsing.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "collections", "typing", "attrs", "httptools"}

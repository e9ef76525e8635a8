"""Requests a hostile or broken client sends, made by a seeded RNG for ``test_attacks``;
and a reader that checks crossbar's answers to them are well-formed HTTP/1.1.

Every kind of request is a small function of the RNG, so a failing seed can be replayed
and a failing case printed as the bytes that were sent.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator

import attrs

ROUTE = "lab"
LOCKED = "locked"
KEY = "attack-test-key"
"""The client key of the route ``locked``."""


@attrs.frozen
class Case:
    """Bytes to send on a new connection; ``hang_up`` closes it after that many bytes,
    without reading."""

    kind: str
    data: bytes
    hang_up: int | None = None


def _chat(rng: random.Random) -> bytes:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": rng.randint(1, 4)}
    if rng.random() < 0.5:
        body["stream"] = True
    if rng.random() < 0.7:
        body["model"] = rng.choice(["tiny-a", "tiny-a", "no-such-model", "x" * 300])
    return json.dumps(body).encode()


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)
    )


def _get(path: str, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (path.encode(), extra)


def valid(rng: random.Random) -> bytes:
    """A request crossbar answers normally."""
    pick = rng.randrange(9)
    if pick < 3:
        return _post(f"/{ROUTE}/v1/chat/completions", _chat(rng))
    if pick == 3:
        body = _chat(rng)
        return (
            b"POST /%s/v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (ROUTE.encode(), len(body), body)
        )
    if pick == 4:
        key = rng.choice([KEY.encode(), b"wrong", b""])
        auth = b"Authorization: Bearer %s\r\n" % key
        return _post(f"/{LOCKED}/v1/chat/completions", _chat(rng), auth)
    paths = [
        f"/{ROUTE}/v1/models",
        f"/{ROUTE}/health",
        f"/{ROUTE}/props",
        "/_crossbar/status",
        "/_crossbar/livez",
        "/_crossbar/readyz",
        "/nowhere/v1/models",
        "/",
    ]
    method = rng.choice([b"GET", b"GET", b"GET", b"OPTIONS", b"DELETE"])
    return _get(rng.choice(paths)).replace(b"GET", method, 1)


def _random_bytes(rng: random.Random) -> bytes:
    data = rng.randbytes(rng.randint(1, 3000))
    if rng.random() < 0.5:
        data = b"GET / HTTP/1.1\r\n" + data
    return data + rng.choice([b"", b"\r\n\r\n"])


def _mutated(rng: random.Random) -> bytes:
    data = bytearray(valid(rng))
    for _ in range(rng.randint(1, 8)):
        if not data:
            break
        at = rng.randrange(len(data))
        op = rng.randrange(5)
        if op == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            data.insert(at, rng.choice(b"\x00\r\n :\t\x7f\xff/.%" + bytes([rng.randrange(256)])))
        elif op == 2:
            del data[at]
        elif op == 3:
            end = min(len(data), at + rng.randint(1, 40))
            data[at:at] = data[at:end]
        else:
            del data[at:]
    return bytes(data)


_BAD_LINES = [
    b"GET",
    b"GET /lab/v1/models",  # HTTP/0.9
    b"GET /lab/v1/models HTTP/2.0",
    b"PRI * HTTP/2.0\r\n\r\nSM",
    b"GET /lab/v1/models HTTP/1.2",
    b"GET /lab/v1/models HTTP/1.1 extra",
    b"GET  /lab/v1/models  HTTP/1.1",
    b" GET /lab/v1/models HTTP/1.1",
    b"GET /lab/v1/models http/1.1",
    b"GET /lab/v1/models HTTP/1.10",
    b"GET /lab/v1/models HTTP/01.1",
    b"GET /lab/v1/models HTTP/1.0",
    b"get /lab/v1/models HTTP/1.1",
    b"GET\t/lab/v1/models\tHTTP/1.1",
    b"GET /lab/v1/models\x0bHTTP/1.1",
    b"GET /lab/v1/models\x00 HTTP/1.1",
    b"\r\n\r\nGET /lab/v1/models HTTP/1.1",
    b"GET http://127.0.0.1/lab/v1/models HTTP/1.1",
    b"GET http://evil.example/lab/v1/models HTTP/1.1",
    b"GET https://user:pass@evil.example:443/_crossbar/status HTTP/1.1",
    b"CONNECT 127.0.0.1:22 HTTP/1.1",
    b"CONNECT evil.example:443 HTTP/1.1",
    b"OPTIONS * HTTP/1.1",
    b"GET * HTTP/1.1",
    b"GET lab/v1/models HTTP/1.1",
    b"GET /lab/../_crossbar/status HTTP/1.1",
    b"GET /lab/v1/../../_crossbar/metrics HTTP/1.1",
    b"GET /./lab/v1/models HTTP/1.1",
    b"GET /lab/%2e%2e/_crossbar/status HTTP/1.1",
    b"GET /lab/v1/models%00 HTTP/1.1",
    b"GET /lab/v1/models?%zz HTTP/1.1",
    b"GET //lab//v1//models HTTP/1.1",
    b"GET /\xc3\xa9\xff\xfe/v1/models HTTP/1.1",
    b"GET /_crossbar/status/../status HTTP/1.1",
    b"GET /_crossbar/status/%2F..%2F HTTP/1.1",
]
_METHODS = [
    b"PUT",
    b"PATCH",
    b"TRACE",
    b"PROPFIND",
    b"BREW",
    b"G\x00ET",
    b"GET\x7f",
    b"\xff\xfe",
    b"M" * 5000,
    b"POST\r",
    b"-",
    b"HEAD\x00",
]


def _bad_line(rng: random.Random) -> bytes:
    if rng.random() < 0.3:
        line = b"%s /%s/v1/chat/completions HTTP/1.1" % (rng.choice(_METHODS), ROUTE.encode())
    elif rng.random() < 0.1:
        line = (
            b"GET /" + rng.choice([b"a", b"%41", b"../"]) * rng.randint(3000, 20000) + b" HTTP/1.1"
        )
    else:
        line = rng.choice(_BAD_LINES)
    body = _chat(rng)
    return b"%s\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (line, len(body), body)


def _huge_header(rng: random.Random) -> bytes:
    size = rng.randint(16 * 1024, 40 * 1024)
    line = rng.choice(
        [
            b"X-" + b"n" * size + b": 1",
            b"X-Big: " + b"v" * size,
            b"Authorization: Bearer " + b"k" * size,
            b"Host: " + b"h" * size,
            b"Cookie: " + b"c=1; " * (size // 5),
        ]
    )
    return _post(f"/{ROUTE}/v1/chat/completions", _chat(rng), line + b"\r\n")


def _many_headers(rng: random.Random) -> bytes:
    count = rng.choice([499, 501, 600, 2000])
    extra = b"".join(b"X-H%d: %d\r\n" % (i, i) for i in range(count))
    return _post(f"/{ROUTE}/v1/chat/completions", _chat(rng), extra)


def _chunked(rng: random.Random) -> bytes:
    body = _chat(rng)
    size = rng.choice(
        [
            b"zz",
            b"-1",
            b"-%x" % len(body),
            b"+%x" % len(body),
            b"0x%x" % len(body),
            b"f" * 20,
            b"%x" % (len(body) + 100),
            b"%x" % max(1, len(body) - 5),
            b"%x ;ext=1" % len(body),
            b"%x;" % len(body) + b"e" * 20000,
            b"",
            b" %x" % len(body),
            b"%x\x00" % len(body),
        ]
    )
    tail = rng.choice(
        [b"\r\n0\r\n\r\n", b"0\r\n\r\n", b"\r\n0\r\nX-Trailer: 1\r\n\r\n", b"\n0\n\n"]
    )
    te = rng.choice([b"chunked", b"Chunked", b"chunked, chunked", b"gzip, chunked", b" chunked"])
    return (
        b"POST /%s/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: %s\r\n"
        b"\r\n%s\r\n%s%s" % (ROUTE.encode(), te, size, body, tail)
    )


def _lengths(rng: random.Random) -> bytes:
    body = _chat(rng)
    n = len(body)
    framing = rng.choice(
        [
            b"Content-Length: -1",
            b"Content-Length: -%d" % n,
            b"Content-Length: +%d" % n,
            b"Content-Length: 0x%x" % n,
            b"Content-Length: %d.0" % n,
            b"Content-Length: %d, %d" % (n, n),
            b"Content-Length: %d\r\nContent-Length: %d" % (n, n),
            b"Content-Length: %d\r\nContent-Length: %d" % (n, n + 1),
            b"Content-Length: 99999999999999999999999999",
            b"Content-Length: %d" % (2**63),
            b"Content-Length: 17000000",
            b"Content-Length: %d" % (n + 50),
            b"Content-Length: %d" % max(0, n - 10),
            b"Content-Length: ",
            b"Content-Length:%d" % n,
            b"Content-Length : %d" % n,
            b"Content-Length: %d\r\nTransfer-Encoding: chunked" % n,
            b"Transfer-Encoding: chunked\r\nContent-Length: %d" % n,
            b"Transfer-Encoding: identity\r\nContent-Length: %d" % n,
            b"Transfer-Encoding: gzip",
            b"Transfer-Encoding: xchunked\r\nContent-Length: %d" % n,
            b"Expect: 100-continue\r\nContent-Length: %d" % n,
            b"Expect: 100-continue\r\nContent-Length: 17000000",
            b"Expect: bogus\r\nContent-Length: %d" % n,
        ]
    )
    return b"POST /%s/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n\r\n%s" % (
        ROUTE.encode(),
        framing,
        body,
    )


def _bad_headers(rng: random.Random) -> bytes:
    line = rng.choice(
        [
            b"X-A: a\x00b",
            b"X-A: a\rb",
            b"X-A: a\nb",
            b"X-A: a\r\n b",  # obs-fold
            b"X-A: a\r\n\tb",
            b"Content-Type: application/json\r\n   ; charset=utf-8",
            b" X-A: leading space",
            b"X-A b",
            b": no name",
            b"X A: space in name",
            b"X-A\x00: nul",
            b"\xff\xfe: \xff",
            b"Host: 127.0.0.1",  # a second Host
            b"Host: evil.example\r\nHost: 127.0.0.1",
            b"Host: \x00",
            b"Connection: upgrade\r\nUpgrade: websocket",
            b"Connection: close, x-api-key",
            b"Transfer-Encoding: chunked\x00",
            b"X-Forwarded-For: 10.0.0.1, \x00",
            b"Authorization: Bearer \r\n " + KEY.encode(),
        ]
    )
    path = rng.choice([ROUTE, LOCKED])
    return _post(f"/{path}/v1/chat/completions", _chat(rng), line + b"\r\n")


def _pipelined(rng: random.Random) -> bytes:
    first = valid(rng)
    second = rng.choice([valid(rng), b""])
    junk = rng.choice([rng.randbytes(rng.randint(1, 500)), b"\r\n\r\n\r\n", _bad_line(rng)])
    return first + second + junk


_KINDS: list[tuple[str, int, Callable[[random.Random], bytes]]] = [
    ("valid", 8, valid),
    ("random", 10, _random_bytes),
    ("mutated", 30, _mutated),
    ("request line", 12, _bad_line),
    ("huge header", 3, _huge_header),
    ("many headers", 2, _many_headers),
    ("chunked", 8, _chunked),
    ("length", 10, _lengths),
    ("header bytes", 9, _bad_headers),
    ("pipelined", 5, _pipelined),
]


def cases(rng: random.Random, count: int) -> Iterator[Case]:
    """``count`` cases, a tenth of them hung up part way through."""
    names = [name for name, _, _ in _KINDS]
    weights = [weight for _, weight, _ in _KINDS]
    makers = {name: make for name, _, make in _KINDS}
    for _ in range(count):
        name = rng.choices(names, weights)[0]
        data = makers[name](rng)
        hang_up = rng.randrange(len(data) + 1) if rng.random() < 0.1 else None
        yield Case(name, data, hang_up)


# -- reading answers ---------------------------------------------------------------------------

_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\r\n]*)?\r\n")
_STATUS_START = re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9]")
_SAMPLE_START = b"HTTP/1.1 200"
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n]*?)[ \t]*")


class BadAnswer(Exception):
    """crossbar wrote bytes that are not an HTTP/1.1 answer."""


@attrs.define
class Answers:
    """The answers found in the bytes a connection received."""

    codes: list[int] = attrs.Factory(list)
    relayed: list[int] = attrs.Factory(list)
    """The codes of answers that came from the host (``Server: llama.cpp``), not crossbar."""
    versions: set[bytes] = attrs.Factory(set)
    complete: bool = True
    """The bytes end where an answer ends (no answer cut short)."""


def read_answers(data: bytes) -> Answers:
    """Every answer in ``data``, in order; BadAnswer if any is malformed. An answer cut
    short at the end (the client hung up) is allowed."""
    found = Answers()
    pos = 0
    while pos < len(data):
        found.complete = False
        status = _STATUS.match(data, pos)
        if status is None:
            rest = data[pos : pos + 64]
            if not _cut_short(rest):
                raise BadAnswer(f"no status line at byte {pos}: {rest!r}")
            return found
        end = data.find(b"\r\n\r\n", status.end() - 2)
        if end < 0:
            return found
        fields: dict[bytes, bytes] = {}
        for line in data[status.end() : end].split(b"\r\n") if end > status.end() else []:
            field = _FIELD.fullmatch(line)
            if field is None:
                raise BadAnswer(f"malformed header line {line[:80]!r}")
            fields[field[1].lower()] = field[2]
        code = int(status[2])
        found.codes.append(code)
        if fields.get(b"server") == b"llama.cpp":
            found.relayed.append(code)
        found.versions.add(status[1])
        pos = end + 4
        if code < 200 or code in (204, 304):
            found.complete = True
            continue
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            next_pos = _chunked_end(data, pos)
            if next_pos is None:
                return found
            pos = next_pos
        elif b"content-length" in fields:
            pos += int(fields[b"content-length"])
            if pos > len(data):
                return found
        else:
            return found  # the body runs to the end of the connection
        found.complete = True
    return found


def _cut_short(rest: bytes) -> bool:
    """Whether ``rest`` may be the start of a status line that was cut short."""
    if b"\n" in rest or len(rest) >= 64:
        return False
    filled = rest[:12] + _SAMPLE_START[len(rest) :]
    return _STATUS_START.match(filled) is not None


def _chunked_end(data: bytes, pos: int) -> int | None:
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size_text = data[pos:line_end].split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BadAnswer(f"bad chunk size {size_text[:20]!r}") from None
        pos = line_end + 2
        if size == 0:
            end = data.find(b"\r\n", pos)
            while end > pos:  # trailers
                pos = end + 2
                end = data.find(b"\r\n", pos)
            return None if end < 0 else end + 2
        if len(data) < pos + size + 2:
            return None
        if data[pos + size : pos + size + 2] != b"\r\n":
            raise BadAnswer("chunk not followed by CRLF")
        pos += size + 2

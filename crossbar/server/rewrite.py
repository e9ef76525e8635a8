"""Pure rules of the proxy's request and answer: which route a path names, which
model a body asks for, which headers cross to the host and back. No I/O here, so
every rule is cheap to test (and :mod:`crossbar.fleet.choice` says which host)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

_VISIBLE = re.compile(rb"[\x21-\x7e]*")
ALLOWED_EXACT = frozenset({b"/health", b"/props"})
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"expect",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
}
NOT_RETURNED = HOP_BY_HOP | {b"content-length"}
BODYLESS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS"})


@attrs.frozen
class RoutePath:
    route: str
    rest: bytes
    """The path after the route segment, always starting with ``/``."""
    query: bytes
    """The query string without ``?``, or empty."""


class BadTarget(Exception):
    """``str()`` is the error message; ``status`` the HTTP code to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_target(uri: bytes) -> RoutePath:
    """Split ``/<route>/<rest>?<query>``; the route segment is never decoded."""
    path, _, query = uri.partition(b"?")
    if not path.startswith(b"/"):
        raise BadTarget(400, "missing route")
    route, slash, rest = path[1:].partition(b"/")
    if not route:
        raise BadTarget(400, "missing route")
    try:
        name = route.decode("ascii")
    except UnicodeDecodeError:
        raise BadTarget(404, "unknown route") from None
    return RoutePath(route=name, rest=b"/" + rest if slash else b"/", query=query)


def allowed_path(rest: bytes) -> bool:
    """Only the OpenAI API and llama-server's harmless ``/health`` and ``/props``."""
    return rest.startswith(b"/v1/") or rest in ALLOWED_EXACT


@attrs.frozen
class Peek:
    model: str | None
    """The top-level ``"model"`` string, when the body is a JSON object naming one."""
    missing: bool
    """The body is a JSON object with no top-level ``"model"`` key at all."""


_NOTHING = Peek(model=None, missing=False)


def peek_model(body: bytes) -> Peek:
    """Find the top-level ``"model"`` of a JSON body; anything else is not an error."""
    start = body.lstrip()[:1]
    if start != b"{":
        return _NOTHING
    try:
        doc = json.loads(body)
    except ValueError:
        return _NOTHING
    if not isinstance(doc, dict):
        return _NOTHING
    if "model" not in doc:
        return Peek(model=None, missing=True)
    model = doc["model"]
    return Peek(model=model if isinstance(model, str) and model else None, missing=False)


def with_model(body: bytes, model: str) -> bytes:
    """Add ``"model"`` right after the opening brace, keeping every other byte."""
    brace = body.index(b"{") + 1
    rest = body[brace:]
    field = b'"model":' + json.dumps(model).encode()
    empty = rest.strip() == b"}"
    return body[:brace] + field + (b"" if empty else b",") + rest


def _one_line(value: bytes) -> bytes:
    """A header value that cannot end its line early (no header injection upstream)."""
    if b"\r" in value or b"\n" in value:
        return value.replace(b"\r", b" ").replace(b"\n", b" ")
    return value


def json_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def upstream_headers(
    incoming: Iterable[tuple[bytes, Sequence[bytes]]],
    client: str,
    secure: bool,
) -> bytes:
    """The client's headers as lines for the host: hop-by-hop ones (and those the
    ``Connection`` header names) dropped, and ``X-Forwarded-*`` set by crossbar (the
    client's own ``X-Forwarded-For`` extended, the others replaced)."""
    headers = list(incoming)
    drop = _NOT_FORWARDED
    forwarded: list[bytes] = []
    host_header: bytes | None = None
    for name, values in headers:
        lower = name.lower()
        if lower == b"connection":
            for value in values:
                drop = drop | {token.strip().lower() for token in value.split(b",")}
        elif lower == b"x-forwarded-for":
            forwarded.extend(values)
        elif lower == b"host" and values and host_header is None:
            host_header = values[0]
    lines = []
    for name, values in headers:
        if name.lower() not in drop:
            for value in values:
                lines.append(b"%s: %s\r\n" % (name, _one_line(value)))
    forwarded.append(client.encode())
    lines.append(b"X-Forwarded-For: %s\r\n" % _one_line(b", ".join(forwarded)))
    lines.append(b"X-Forwarded-Proto: %s\r\n" % (b"https" if secure else b"http"))
    if host_header is not None:
        lines.append(b"X-Forwarded-Host: %s\r\n" % _one_line(host_header))
    return b"".join(lines)


def printable(raw: bytes, limit: int) -> str:
    """What a client sent, fit for one log line: bytes outside printable ASCII escaped
    (``\\xNN``), at most ``limit`` characters, and ``...`` when cut."""
    if _VISIBLE.fullmatch(raw):
        text = raw.decode("ascii")
    else:
        text = "".join(chr(b) if 0x21 <= b <= 0x7E else f"\\x{b:02x}" for b in raw[:limit])
    return text if len(text) <= limit else text[: limit - 3] + "..."

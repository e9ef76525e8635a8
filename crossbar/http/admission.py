"""The front door's rules: what a request's head alone decides, before its body is
read. Pure: every rule takes bytes and headers and says yes, or how to refuse.

The hygiene rules refuse what a host, or a proxy between crossbar and a host, could
read differently from crossbar: a header folded onto the line before, two ``Host``
headers, a method llama-server has no use for, a path that climbs out of the route
(``..``, however it is spelled). Each costs the common request a few byte scans, no
regex and no decoding.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from urllib.parse import unquote_to_bytes

import attrs

from crossbar.config import Secret
from crossbar.config.secrets import RawHeaders
from crossbar.http.errors import error_payload


@attrs.frozen
class Refusal:
    """How to turn a request away: a status, a JSON ``{"error": ...}``, extra headers,
    and whether the connection is closed after it (when what follows cannot be trusted
    to be the next request)."""

    status: int
    error: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
    close: bool = False


Guard = Callable[[bytes, RawHeaders], Refusal | Secret | None]
"""A rule over a request's path (without query) and headers, applied when the head is
complete: ``None`` lets it in, and so does a key (the one that let it in: the proxy knows
who asked, for usage and fairness, without walking the head again)."""

SHUTTING_DOWN = Refusal(503, "shutting down", ((b"Retry-After", b"1"),), close=True)
"""A request that arrives on an open connection while crossbar drains."""

_METHODS = (b"GET", b"HEAD", b"POST", b"DELETE", b"OPTIONS")
METHODS = frozenset(_METHODS)
"""What an OpenAI-style API and crossbar's pages are asked with; anything else is 405."""

FOLDED = Refusal(400, "folded header line", close=True)
SEVERAL_HOSTS = Refusal(400, "more than one Host header", close=True)
NO_HOST = Refusal(400, "no Host header", close=True)
HEAD_TOO_LARGE = Refusal(431, "request header line too long", close=True)
NOT_ALLOWED = Refusal(405, "method not allowed", ((b"Allow", b", ".join(_METHODS)),), close=True)
DOT_SEGMENT = Refusal(400, "path with a . or .. segment", close=True)
BAD_REQUEST = Refusal(400, "bad request", close=True)
"""What twisted.web's own parser refuses (conflicting lengths, a bad chunk, ...)."""
TOO_LARGE = Refusal(413, "body too large", close=True)
BUSY = Refusal(503, "busy", ((b"Retry-After", b"1"),), close=True)
"""Request bodies held at once would pass ``max_body_memory``."""
BODY_TOO_SLOW = Refusal(408, "request body too slow", close=True)
HEAD_TOO_SLOW = Refusal(408, "request head too slow", close=True)
NO_REQUEST = Refusal(408, "no request sent", close=True)
"""A new connection whose first byte did not come within ``head_timeout``."""
NOT_CHUNKED = Refusal(400, "Transfer-Encoding other than chunked", close=True)
BAD_HOST = Refusal(400, "Host header is not a host name", close=True)
NOT_UTF8 = Refusal(400, "path is not UTF-8", close=True)

REASONS = {
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
FOLD_STARTS = (b" ", b"\t")
"""What a folded line starts with."""
_DOTS = (b".", b"..")


def folded(line: bytes) -> bool:
    """Whether a line of a request's head continues the line before (obs-fold).

    twisted.web joins such a line to the header above it; a host or a proxy that reads
    it as a header of its own would see another request than crossbar did. A request
    line starting with a space is no better.
    """
    return line[:1] in FOLD_STARTS


_TE = b"transfer-encoding:"


def not_chunked(line: bytes) -> bool:
    """Whether a header line is a ``Transfer-Encoding`` other than exactly ``chunked``.

    twisted.web ignores ``identity``, so ``Transfer-Encoding: identity`` with a
    ``Content-Length`` would pass the "both framings: 400" rule, and a host or a proxy
    between might read the body by either. A request with a body that is not chunked
    says ``Content-Length``; any other coding (``gzip, chunked``, ``chunked, chunked``)
    has no meaning here. Two ``chunked`` lines are twisted.web's own 400.
    """
    return line[:18].lower() == _TE and line[18:].strip(b" \t").lower() != b"chunked"


def several_hosts(hosts: Sequence[bytes] | None) -> bool:
    """Whether the head names more than one ``Host`` (which one would a host believe?)."""
    return hosts is not None and len(hosts) > 1


def dot_segment(path: bytes) -> bool:
    """Whether a path (without query) has a ``.`` or ``..`` segment after its first
    (the route), once decoded the way a host might decode it: ``%2e`` for a dot, ``%2f``,
    ``%5c`` and ``\\`` for a slash, ``%25`` for a percent sign (decoded twice), and any
    ``;params`` after a segment dropped. The route's own name is never decoded.
    """
    if b"." not in path and b"%" not in path:
        return False  # the common request: two scans of a short path
    rest = path[1:].partition(b"/")[2]
    if b"%" in rest:
        rest = rest.lower().replace(b"%25", b"%")
        rest = rest.replace(b"%2e", b".").replace(b"%2f", b"/").replace(b"%5c", b"/")
    if b"." not in rest:
        return False
    for segment in rest.replace(b"\\", b"/").split(b"/"):
        if segment.partition(b";")[0] in _DOTS:
            return True
    return False


def hygiene(
    method: bytes, path: bytes, hosts: Sequence[bytes] | None, version: bytes = b"HTTP/1.1"
) -> Refusal | None:
    """The head's own soundness, before anyone's keys are looked at: ``hosts`` is every
    ``Host`` header's value (``None``: none), ``path`` the target without its query. An
    HTTP/1.1 request must name its host (RFC 9112, 3.2); an HTTP/1.0 one may not."""
    if hosts is None:
        if version == b"HTTP/1.1":
            return NO_HOST
    elif len(hosts) > 1:
        return SEVERAL_HOSTS
    if method not in METHODS:
        return NOT_ALLOWED
    if (b"." in path or b"%" in path) and dot_segment(path):
        return DOT_SEGMENT
    return None


def unreadable_page(path: bytes, hosts: Sequence[bytes] | None) -> Refusal | None:
    """What crossbar's pages (Klein, routing with werkzeug) cannot read: a path that is
    not UTF-8 once decoded, or a ``Host`` whose name is no IDNA host name (an empty
    label, one over 63 characters). Refused here as a 400 rather than left to become a
    500 and a traceback in the log."""
    try:
        unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8
    if hosts:
        host = hosts[0]
        name = host.split(b"]", 1)[0] + b"]" if host[:1] == b"[" else host.split(b":", 1)[0]
        try:
            name.decode("utf-8").encode("idna")
        except UnicodeError:
            return BAD_HOST
    return None


def while_draining(heads: int, path: bytes) -> Refusal | None:
    """A stopping crossbar still answers a connection's first request (``heads`` is 1:
    its client connected before the port closed and has nowhere else to send it) and
    the pages (readyz says it drains); a further request on a kept-alive connection, in
    the race with its closing, is told to go elsewhere."""
    if heads > 1 and not path.startswith(b"/_crossbar/"):
        return SHUTTING_DOWN
    return None


def answer(refusal: Refusal, head_only: bool = False, path: bytes = b"") -> bytes:
    """A refusal's bytes on the wire: its JSON error (in the shape ``path``'s API reads),
    its length, its headers, and the connection's end (``head_only``: the answer to a HEAD,
    without the body)."""
    payload = error_payload(path, refusal.status, refusal.error)
    body = json.dumps(payload, separators=(",", ":")).encode()
    lines = [
        b"HTTP/1.1 %d %s\r\n" % (refusal.status, REASONS.get(refusal.status, b"Refused")),
        b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body),
        b"Connection: close\r\n",
    ]
    lines.extend(b"%s: %s\r\n" % header for header in refusal.headers)
    lines.append(b"\r\n" if head_only else b"\r\n" + body)
    return b"".join(lines)

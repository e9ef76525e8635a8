"""Pure rules of the proxy's request and answer: which route a path names, which
headers cross to the host and back. No I/O here, so every rule is cheap to test
(:mod:`crossbar.proxy.shapes` says which paths are forwarded and what their bodies ask
for, and :mod:`crossbar.routing.policies` which host)."""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import attrs

from crossbar.config import Config, Network

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
    b"forwarded",
    b"x-real-ip",
    # llama-server keys its resumable stream sessions by it: as the client sent it, one
    # key holder could replay or end another's answer, and a client that left would
    # keep its GPU generating.
    b"x-conversation-id",
}
CREDENTIALS = frozenset({b"authorization", b"x-api-key"})
"""The headers a client's key travels in."""
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
    return RoutePath(name, b"/" + rest if slash else b"/", query)


class _Headers(Protocol):
    """The answer's headers, as twisted.web's ``Headers`` has them."""

    def removeHeader(self, name: bytes) -> None: ...
    def setRawHeaders(self, name: bytes, values: Sequence[bytes]) -> None: ...
    def addRawHeader(self, name: bytes, value: bytes) -> None: ...


def answer_headers(
    out: _Headers, headers: Iterable[tuple[bytes, bytes]], length: int | None, host: str
) -> None:
    """The host's answer headers as the client gets them: hop-by-hop ones dropped, the
    host's own replacing twisted.web's defaults (``Content-Type``, ``Date``), its
    ``Content-Length`` when it sent one, and which host answered."""
    out.removeHeader(b"server")
    seen = set()
    for name, value in headers:
        lower = name.lower()
        if lower in NOT_RETURNED:
            continue
        if lower in seen:
            out.addRawHeader(name, value)
        else:
            seen.add(lower)
            out.setRawHeaders(name, [value])
    if length is not None:
        out.setRawHeaders(b"content-length", [b"%d" % length])
    out.setRawHeaders(b"x-crossbar-host", [host.encode()])


def _one_line(value: bytes) -> bytes:
    """A header value that cannot end its line early (no header injection upstream)."""
    if b"\r" in value or b"\n" in value:
        return value.replace(b"\r", b" ").replace(b"\n", b" ")
    return value


def json_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


_FORWARD, _CREDENTIAL, _DROP, _CONNECTION, _FORWARDED_FOR, _HOST = range(6)
_KINDS: dict[bytes, int] = {}
"""What each header name (lower case) is, decided once per name: a header's path
costs one dict look-up. Bounded: names past it are decided every time."""


def _kind(lower: bytes) -> int:
    if lower == b"connection":
        kind = _CONNECTION
    elif lower == b"x-forwarded-for":
        kind = _FORWARDED_FOR
    elif lower == b"host":
        kind = _HOST
    elif lower in _NOT_FORWARDED or lower.startswith(b"x-crossbar-"):
        kind = _DROP
    elif lower in CREDENTIALS:
        kind = _CREDENTIAL
    else:
        kind = _FORWARD
    if len(_KINDS) < 1024:
        _KINDS[lower] = kind
    return kind


_Sorted = tuple[list[bytes], list[bytes], list[bytes], bytes | None, list[bytes]]
"""Lines for the host, credential lines, ``X-Forwarded-For`` values to keep, the
``Host`` header, and what ``Connection`` says."""


def _sort(
    headers: list[tuple[bytes, Sequence[bytes]]], trusted: bool, named: set[bytes]
) -> _Sorted:
    """One pass over the client's headers: each line to where it goes."""
    lines: list[bytes] = []
    credentials: list[bytes] = []
    forwarded: list[bytes] = []
    connection: list[bytes] = []
    host = None
    kinds = _KINDS
    for name, values in headers:
        lower = name.lower()
        kind = kinds.get(lower)
        if kind is None:
            kind = _kind(lower)
        if kind <= _CREDENTIAL:  # a line for the host
            if named and lower in named:
                continue
            target = lines if kind == _FORWARD else credentials
            for value in values:
                target.append(b"%s: %s\r\n" % (name, _one_line(value)))
        elif kind == _CONNECTION:
            connection.extend(values)
        elif kind == _FORWARDED_FOR:
            if trusted:
                forwarded.extend(values)
        elif kind == _HOST and values and host is None:
            host = values[0]
    return lines, credentials, forwarded, host, connection


def upstream_headers(
    incoming: Iterable[tuple[bytes, Sequence[bytes]]],
    client: str,
    secure: bool,
    trusted: bool = False,
) -> tuple[bytes, bytes]:
    """The client's headers as lines for the host, and apart from them its credential
    lines (``Authorization``, ``X-Api-Key``), which cross only when neither the route
    nor the host has keys of its own.

    Hop-by-hop headers (and those the ``Connection`` header names) are dropped, and so
    are ``Forwarded``, ``X-Real-IP`` and any ``X-Crossbar-*`` a client sent: a host
    must not take a client's word for what crossbar says. ``X-Forwarded-*`` are set by
    crossbar: the client's own ``X-Forwarded-For`` is extended when the client is a
    ``trusted`` proxy, else replaced by the client's address alone."""
    headers = list(incoming)
    lines, credentials, forwarded, host, connection = _sort(headers, trusted, set())
    if connection:
        named = {t.strip().lower() for v in connection for t in v.split(b",")}
        named -= _NOT_FORWARDED
        if named:  # rare: Connection names headers of its own, so sort again without them
            lines, credentials, *_ = _sort(headers, trusted, named)
    forwarded.append(client.encode())
    lines.append(b"X-Forwarded-For: %s\r\n" % _one_line(b", ".join(forwarded)))
    lines.append(b"X-Forwarded-Proto: %s\r\n" % (b"https" if secure else b"http"))
    if host is not None:
        lines.append(b"X-Forwarded-Host: %s\r\n" % _one_line(host))
    return b"".join(lines), b"".join(credentials)


def host_keys(config: Config) -> dict[str, bytes]:
    """The ``Authorization`` line of each host that has an ``api_key``: it replaces
    whatever credentials the client sent."""
    return {
        name: b"Authorization: Bearer %s\r\n" % host.api_key.value
        for name, host in config.hosts.items()
        if host.api_key is not None
    }


@functools.lru_cache(maxsize=1024)
def trusted_proxy(client: str, networks: tuple[Network, ...]) -> bool:
    """Whether the peer at ``client`` (an address as the socket gives it) is one of the
    ``trusted_proxies``; remembered, since a lab's few proxies ask again and again."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:  # not an IP address (a UNIX socket)
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)

"""Who a request is, for fairness, and what it may do: a flow (a client, by name, with its
band and limits), made from a request by :func:`flow_of` (its key's holder, an unnamed
key, or its client's address: an IPv6 client's /64, behind a trusted proxy the client it
forwards), the one rule that gives a flow its band, a room's limit, and a refusal in
words. Values and pure rules only, no I/O."""

from __future__ import annotations

import functools
import ipaddress
import math
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from typing import Any

import attrs

from crossbar.config import KeyHolder, Network, RouteConfig, Secret, key_held
from crossbar.queueing.slotuse import WINDOW_SECONDS

BANDS = {"interactive": 0, "normal": 1, "batch": 2}
"""Each priority's band, 0 first."""


def band_of(holder: KeyHolder | None) -> int:
    """A flow's band, by the one rule: its key holder's priority; a request with no
    holder (an unnamed key, or a client known by its address) is ``normal``."""
    return BANDS["normal"] if holder is None else BANDS[holder.priority]


def _optional_ge(low: int) -> Any:
    return attrs.validators.optional(attrs.validators.ge(low))


@attrs.frozen
class Flow:
    """One client, as the caller names it: a key's name or an address, never a key."""

    name: str
    band: int = attrs.field(default=band_of(None), validator=attrs.validators.ge(0))
    """Priority band, 0 first: a band goes only when no lower one has anyone waiting.
    Made by :func:`band_of` (unless given: ``normal``, as for a flow with no holder)."""
    max_in_flight: int | None = attrs.field(default=None, validator=_optional_ge(1))
    """Past this many running, the flow is passed over until one of them ends."""
    max_waiting: int | None = attrs.field(default=None, validator=_optional_ge(0))
    """Past this many waiting (in all pools), another is refused."""

    def may_start(self, in_flight: int) -> bool:
        """Whether one more of its requests may go to a slot while ``in_flight`` of them
        are running: below its ``max_in_flight``, whether a slot is free or not."""
        return self.max_in_flight is None or in_flight < self.max_in_flight


@attrs.frozen
class PoolLimit:
    """How many may wait in one room (a route: every pool of it), which its name names
    (and a refusal gives)."""

    name: str
    max_waiting: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen
class Refused:
    """Why :meth:`FairQueue.push` turned a request away: the status, the error in words
    for the client's JSON, and seconds to wait before trying again (``Retry-After``)."""

    status: int
    error: str
    retry_after: int
    reason: str = "limit"
    """Why, in one word for a metric's label: ``limit``, ``timeout`` or ``stopping``."""


def refusal(name: str, limit: int, waited: float) -> Refused:
    """A 429 in words; retry after about as long as the oldest of those waiting has
    waited (roughly how long the queue takes to turn over), 1 s to 5 min."""
    words = f"{_requests(limit)} already waiting" if limit else "every slot is busy, none may wait"
    return Refused(429, f"{name}: {words}", _retry_after(waited))


def gave_way(name: str, limit: int, held: int, waited: float) -> Refused:
    """The 429 in words for a request that gave its place up in ``name``'s full waiting
    room: its client held the most places (``held``), and one holding fewer came."""
    words = (
        f"{name}: {_requests(limit)} already waiting, {held} of them this client's, the most"
        " of any: its newest gave way to another client's"
    )
    return Refused(429, words, _retry_after(waited))


def _requests(count: int) -> str:
    return "1 request" if count == 1 else f"{count} requests"


def _retry_after(waited: float) -> int:
    return min(WINDOW_SECONDS, max(1, math.ceil(waited)))


def flow_of(
    route: RouteConfig,
    headers: Iterable[tuple[bytes, Sequence[bytes]]],
    client: str,
    key: Secret | None = None,
    trusted: tuple[Network, ...] = (),
) -> Flow:
    """Who a request is, for fairness: its key's holder (by name), an unnamed key (by a
    short fingerprint that cannot be turned back into it), else the client's address
    (:func:`client_group`; behind one of the ``trusted`` proxies, the client it
    forwards). ``key``: the one the door let it in with, if it is one of the route's
    (else the head is read again)."""
    if route.api_keys:
        if key is None or not _one_of(key, route.api_keys):
            headers = list(headers)
            key = key_held(headers, route.api_keys)
        if key is not None:
            return _key_flow(key, route)
    if trusted:
        client = forwarded_client(client, headers, trusted)
    return Flow(client_group(client), band_of(None))


def client_group(address: str) -> str:
    """The client an address stands for: itself, or for IPv6 its /64 (what one machine
    is given), an IPv4-mapped one as IPv4; anything else (a UNIX socket) as it is. One
    rule for the fair queue's flows and each client's share of the connections."""
    return address if ":" not in address else _v6_group(address)


@functools.lru_cache(maxsize=4096)
def _v6_group(address: str) -> str:
    try:
        parsed = ipaddress.IPv6Address(address.partition("%")[0])
    except ValueError:
        return address
    if parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(ipaddress.IPv6Network((parsed, 64), strict=False))


def forwarded_client(
    peer: str, headers: Iterable[tuple[bytes, Sequence[bytes]]], trusted: tuple[Network, ...]
) -> str:
    """The client a request came from: ``peer``, or when ``peer`` is one of the
    ``trusted`` proxies, the last address of ``X-Forwarded-For`` that is not one of them
    (the one a trusted proxy saw; what comes before it is the client's own word). A
    hop that is not an address ends the search at the proxy before it."""
    if not _among(peer, trusted):
        return peer
    hops = [
        hop
        for name, values in headers
        if name.lower() == b"x-forwarded-for"
        for value in values
        for hop in value.split(b",")
    ]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            break
        peer = address
        if not _among(address, trusted):
            break
    return peer


def _address(hop: bytes) -> str | None:
    """An ``X-Forwarded-For`` hop's address (a port, and IPv6 brackets, taken off)."""
    text = hop.strip().decode("ascii", "replace")
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _among(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        parsed = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:  # not an IP address (a UNIX socket)
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return any(parsed in network for network in networks)


def _one_of(key: Secret, keys: Iterable[Secret]) -> bool:
    """Whether ``key`` is one of ``keys`` itself (not merely equal)."""
    return any(mine is key for mine in keys)


_FLOWS: dict[tuple[int, int | None, int | None], tuple[Secret, Flow]] = {}
"""Each configured key's flow, with each route's limits for keys without their own,
made once (a frozen value, checked as it is built)."""


def _key_flow(key: Secret, route: RouteConfig) -> Flow:
    in_flight, waiting = route.max_in_flight_per_key, route.max_waiting_per_key
    known = _FLOWS.get((id(key), in_flight, waiting))
    if known is not None and known[0] is key:
        return known[1]
    holder = key.holder
    if holder is None:
        flow = Flow(f"key-{_fingerprint(key.value)}", band_of(None), in_flight, waiting)
    else:
        if holder.max_in_flight is not None:
            in_flight = holder.max_in_flight
        if holder.max_waiting is not None:
            waiting = holder.max_waiting
        flow = Flow(holder.name, band_of(holder), in_flight, waiting)
    if len(_FLOWS) >= 1024:  # reloads made new keys: the old ones go
        _FLOWS.clear()
    _FLOWS[id(key), route.max_in_flight_per_key, route.max_waiting_per_key] = (key, flow)
    return flow


@functools.lru_cache(maxsize=256)
def _fingerprint(value: bytes) -> str:
    """Remembered: called with configured keys' values only, a few, on every request."""
    return blake2b(value, digest_size=4, person=b"crossbar-flow").hexdigest()

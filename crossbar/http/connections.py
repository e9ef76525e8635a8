"""The client connections a site holds, and its caps on them: ``max_connections`` in
all, and each client's share of them, so that one machine's silent sockets cannot lock
everyone else out. At the cap, the oldest connection with no request under way (idle
between requests, or not a byte sent yet) gives way to the new one; with none idle, or
past the client's share, the new one is closed at once.

What is refused or closed is logged at most one line of each kind every
:data:`LOGGED_EVERY` seconds, however many connections a flood makes."""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.logger import Logger

from crossbar.config import Limits, Network
from crossbar.http.headers import trusted_proxy
from crossbar.http.timers import stop
from crossbar.queueing import client_group

LOGGED_EVERY = 10.0
"""Seconds between two log lines about connections refused or closed at the caps."""

log = Logger()


class Held(Protocol):
    """A connection as the caps see it (crossbar.http.site's Channel)."""

    client: str | None
    idle: bool

    def give_way(self) -> None: ...


_REFUSED, _REFUSED_SHARE, _CLOSED, _CLOSED_SHARE = range(4)
LIMIT_NAMES = {_CLOSED: "max_connections", _CLOSED_SHARE: "max_connections_per_client"}
"""The limit an idle connection gave way for, as ``closed_idle`` and the metrics name it."""
_ALL, _EACH = f"{LIMIT_NAMES[_CLOSED]} limit", f"{LIMIT_NAMES[_CLOSED_SHARE]} limit"
_LINES = {
    _REFUSED: "refused {count} client connection{s}: {limit} open, the " + _ALL,
    _REFUSED_SHARE: "refused {count} client connection{s} from {clients}: {limit} open from"
    " each, the " + _EACH,
    _CLOSED: "closed {count} idle client connection{s} to make room for new ones: {limit}"
    " open, the " + _ALL,
    _CLOSED_SHARE: "closed {count} idle client connection{s} from {clients} to make room for"
    " their new ones: {limit} open from each, the " + _EACH,
}


class Connections:
    """The connections open now, who holds them, which are idle (oldest first)."""

    def __init__(self, reactor: IReactorTime) -> None:
        self.open: set[Any] = set()
        """The client connections open now (closed one by one when crossbar stops)."""
        self.refused = 0
        """Connections closed at once since start: ``max_connections`` open and none
        idle, or their client's share open and none idle."""
        self.closed_idle: Counter[str] = Counter()
        """Idle connections closed since start to make room for new ones, by the limit
        reached: ``max_connections`` (all open) or ``max_connections_per_client`` (the
        new one's client's share)."""
        self._reactor = reactor
        self._limits = Limits()
        self._clients: Counter[str] = Counter()
        self._idle: dict[Held, None] = {}
        self._idle_of: dict[str, dict[Held, None]] = {}
        """Each client's idle connections, oldest first (only those with a share)."""
        self._unlogged: Counter[tuple[int, str]] = Counter()
        """What was refused or closed since the last log line, by kind and client."""
        self._log_call: IDelayedCall | None = None

    def admit(self, addr: IAddress | None, limits: Limits) -> tuple[bool, str | None]:
        """Whether a new connection from ``addr`` may be held (an idle one closed to make
        room if need be), and the client whose share it counts in."""
        self._limits = limits
        client = client_of(addr, limits.trusted_proxies)
        if client is not None and self._clients[client] >= limits.max_connections_per_client:
            idle = self._idle_of.get(client)
            if not idle:
                return self._note(_REFUSED_SHARE, client), client
            self._give_way(next(iter(idle)), _CLOSED_SHARE, client)
        elif len(self.open) >= limits.max_connections:
            if not self._idle:
                return self._note(_REFUSED, ""), client
            self._give_way(next(iter(self._idle)), _CLOSED, "")
        return True, client

    def add(self, held: Held, client: str | None) -> None:
        held.client = client
        self.open.add(held)
        if client is not None:
            self._clients[client] += 1

    def rest(self, held: Held) -> None:
        """``held`` has no request under way: the newest idle connection."""
        if held in self.open:
            held.idle = True
            self._idle[held] = None
            if held.client is not None:
                self._idle_of.setdefault(held.client, {})[held] = None

    def busy(self, held: Held) -> None:
        """``held`` has begun a request (or is refused one): it no longer gives way."""
        held.idle = False
        if held not in self._idle:
            return
        del self._idle[held]
        client = held.client
        if client is not None:
            idle = self._idle_of[client]
            del idle[held]
            if not idle:
                del self._idle_of[client]

    def forget(self, held: Held) -> None:
        """``held`` is closing: it no longer counts in the caps."""
        if held not in self.open:
            return
        self.open.discard(held)
        self.busy(held)
        client = held.client
        if client is not None:
            left = self._clients[client] - 1
            if left:
                self._clients[client] = left
            else:
                del self._clients[client]

    def stop(self) -> None:
        stop(self._log_call)
        self._log_call = None

    def _give_way(self, oldest: Held, kind: int, client: str) -> None:
        self.forget(oldest)
        oldest.give_way()
        self.closed_idle[LIMIT_NAMES[kind]] += 1
        self._note(kind, client)

    def _note(self, kind: int, client: str) -> bool:
        if kind in (_REFUSED, _REFUSED_SHARE):
            self.refused += 1
        self._unlogged[kind, client] += 1
        if self._log_call is None:
            self._log()
        return False

    def _log(self) -> None:
        """At most one line of each kind every LOGGED_EVERY seconds."""
        self._log_call = None
        if not self._unlogged:
            return
        unlogged, self._unlogged = self._unlogged, Counter()
        limits = self._limits
        for kind, line in _LINES.items():
            clients = Counter({client: n for (k, client), n in unlogged.items() if k == kind})
            if not clients:
                continue
            count = clients.total()
            (first, _), *others = clients.most_common()
            more = f" and {len(others)} other address{'es' if len(others) > 1 else ''}"
            shared = kind in (_REFUSED_SHARE, _CLOSED_SHARE)
            log.warn(
                line,
                count=count,
                s="" if count == 1 else "s",
                clients=first + (more if others else ""),
                limit=limits.max_connections_per_client if shared else limits.max_connections,
            )
        self._log_call = self._reactor.callLater(LOGGED_EVERY, self._log)


def client_of(addr: IAddress | None, trusted: tuple[Network, ...]) -> str | None:
    """The client whose share a connection from ``addr`` counts in: its IP address, or
    for IPv6 its /64 (what one machine is given; :func:`~crossbar.queueing.client_group`,
    as the fair queue's flows); ``None`` for one of the trusted proxies (many clients
    behind each) or a peer with no IP address (a UNIX socket)."""
    host = getattr(addr, "host", None)
    if not isinstance(host, str) or not host:
        return None
    if trusted and trusted_proxy(host, trusted):
        return None
    return client_group(host)

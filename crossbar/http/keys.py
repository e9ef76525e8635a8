"""Who may come in: the keys a client must show, decided from a request's head alone
(a :data:`~crossbar.http.admission.Guard`), so that a stranger's body is never read.

A key is offered as ``Authorization: Bearer <key>`` (the scheme in any case) or
``X-Api-Key: <key>`` and compared in constant time. A route with keys needs one of
its own; ``/_crossbar/`` needs a status key, except ``livez`` and ``readyz`` that a
load balancer asks. With no ``status_keys`` but a route with keys, the pages take any
route's key: a stranger never reads them, whatever was left out of the config. A route
that does not exist needs a key of some route whenever any route has keys: a stranger
then gets the same 401 for a route with keys as for one that is not there, and cannot
learn their names by trying.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import unquote_to_bytes

import attrs

from crossbar.config import Config, Secret
from crossbar.config.secrets import RawHeaders, holds_key, key_held
from crossbar.http.admission import Refusal

UNAUTHORIZED = Refusal(401, "unauthorized", headers=((b"WWW-Authenticate", b"Bearer"),), close=True)
"""Closed after it: the body of a request refused unread is not read either."""
PAGES_UNAUTHORIZED = attrs.evolve(UNAUTHORIZED, error="unauthorized: the status pages need a key")
"""A stranger at the status pages (not the probes)."""
STATUS = b"_crossbar"
PROBES = frozenset({b"/_crossbar/livez", b"/_crossbar/readyz"})
"""Open to all, whatever the keys: a load balancer asks them without one."""


@attrs.frozen
class Peers:
    """A worker's private port (``workers: N``), where only its peers come: every path,
    the probes too, wants the run's ``secret``, whatever keys the config has."""

    secret: Secret


Pages = Literal["all", "probes", "only"] | Peers
"""What ``/_crossbar/`` is on a listener (see :class:`KeyGuard`)."""


@attrs.frozen
class KeyGuard:
    """The keys of one listener, checked on every request's head.

    ``routes`` maps each route's name to its keys (empty: open). ``pages`` says what
    ``/_crossbar/`` is on this listener: ``"all"`` (the status pages, behind
    ``status`` keys), ``"probes"`` (only livez and readyz: nothing to guard) or
    ``"only"`` (a listener of the pages alone, where every path needs a status key
    but the probes: it serves no route, and its paths are walked decoded), or
    :class:`Peers` (a worker's private port: every path needs its secret).
    """

    routes: Mapping[bytes, tuple[Secret, ...]]
    status: tuple[Secret, ...]
    """The keys the pages take: ``status_keys``, or with none, every route's keys."""
    pages: Pages = "all"
    any_route: tuple[Secret, ...] = attrs.field(init=False)
    """Every route's keys together: what a route that is not there asks for."""

    @any_route.default
    def _every_key(self) -> tuple[Secret, ...]:
        return tuple({key: None for keys in self.routes.values() for key in keys})

    @classmethod
    def for_config(cls, config: Config, pages: Pages = "all") -> KeyGuard:
        if isinstance(pages, Peers):
            return cls({}, (pages.secret,), pages)
        routes = {name.encode("ascii"): route.api_keys for name, route in config.routes.items()}
        guard = cls(routes, config.status_keys, pages)
        return guard if config.status_keys else attrs.evolve(guard, status=guard.any_route)

    @staticmethod
    def pages_take_route_keys(config: Config) -> bool:
        """Whether the pages take any route's key: some route has keys, and there are no
        ``status_keys`` to ask for instead."""
        return not config.status_keys and any(r.api_keys for r in config.routes.values())

    @property
    def needed(self) -> bool:
        """Whether it can ever refuse: with no keys to ask for, a site needs no guard."""
        pages_guarded = bool(self.status) and self.pages != "probes"
        return pages_guarded or (self.pages != "only" and bool(self.any_route))

    def __call__(self, path: bytes, headers: RawHeaders) -> Refusal | Secret | None:
        if isinstance(self.pages, Peers):
            return None if holds_key(headers, self.status) else UNAUTHORIZED
        if self.pages == "only":
            return self._status(path, headers)
        segment = path[1:].partition(b"/")[0]
        if segment == STATUS or (b"%" in segment and unquote_to_bytes(segment) == STATUS):
            return self._status(path, headers) if self.pages == "all" else None
        keys = self.routes.get(segment)
        if keys is None:  # no such route (or none named): the proxy says which
            keys = self.any_route if segment else ()
        if not keys:
            return None
        key = key_held(headers, keys)
        return unauthorized(headers) if key is None else key

    def _status(self, path: bytes, headers: RawHeaders) -> Refusal | None:
        if not self.status or path in PROBES or holds_key(headers, self.status):
            return None
        return PAGES_UNAUTHORIZED


_CHALLENGE = ((b"WWW-Authenticate", b"Bearer"),)
NO_KEY = Refusal(401, "unauthorized: no key sent", _CHALLENGE, close=True)
NOT_BEARER = Refusal(
    401, "unauthorized: Authorization without Bearer (send Authorization: Bearer <key>)",
    _CHALLENGE, close=True,
)  # fmt: skip
UNKNOWN_KEY = Refusal(401, "unauthorized: key not known", _CHALLENGE, close=True)


def unauthorized(headers: RawHeaders) -> Refusal:
    """The 401 for a route's request whose head holds none of its keys, saying why: no key
    sent (an empty one counts as none), an ``Authorization`` without ``Bearer``, or a key
    it does not know (never which)."""
    not_bearer = False
    for name, values in headers:
        lower = name.lower()
        for value in values if lower in (b"authorization", b"x-api-key") else ():
            parts = value.split(None, 1)
            if lower == b"x-api-key":
                if parts:
                    return UNKNOWN_KEY
            elif parts and parts[0].lower() == b"bearer":
                if len(parts) == 2:
                    return UNKNOWN_KEY
            elif parts:
                not_bearer = True
    return NOT_BEARER if not_bearer else NO_KEY

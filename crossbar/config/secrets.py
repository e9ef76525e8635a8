"""Keys and other secrets from crossbar.yaml: read once, never shown.

A key in the config is a literal or names environment variables as ``${NAME}``, so
that the file itself can be shared. Whatever it holds, a :class:`Secret` prints as
``****`` (in a ``repr``, an error, a log line or a page), and URLs are shown with
their password masked.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

import attrs

MASK = "****"
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(rb"[\x21-\x7e]+")
"""What a key may hold: printable ASCII without spaces, so that it fits a header."""
_PASSWORD = re.compile(r"(?<=//)([^/@:?#\s'\"]*):[^\s'\"]*@")
"""A user name, then a password up to the last ``@`` before a space or a quote: a
password may hold ``/``, ``?``, ``#`` and ``@``, which end an authority for urllib."""


PRIORITIES = ("interactive", "normal", "batch")
"""The bands of a busy fleet's queue, first served first: strict between bands."""


@attrs.frozen
class KeyHolder:
    """Who holds a key (``api_keys`` in mapping form): the name shown everywhere in the
    key's place, and the holder's share of a busy fleet."""

    name: str
    priority: str = "normal"
    """One of :data:`PRIORITIES`."""
    max_in_flight: int | None = None
    """Requests of this holder's sent to hosts at once; more wait in crossbar."""
    max_waiting: int | None = None
    """Requests of this holder's waiting at once; more are answered 429."""
    models: tuple[str, ...] = ()
    """Glob patterns of the models this holder may ask for; another is answered 403.
    Empty: every model its routes serve."""
    max_loads_per_minute: int | None = None
    """Model loads this holder's requests may cause in a minute; more are answered 429."""


@attrs.frozen(repr=False)
class Secret:
    """A key. ``value`` is for the wire only; ``source`` says where it came from
    (``${NAME}`` or ``literal``) and is all that is ever shown, with its holder's name."""

    value: bytes = attrs.field(eq=True)
    source: str = attrs.field(default="literal", eq=False)
    holder: KeyHolder | None = attrs.field(default=None, eq=False)

    def __repr__(self) -> str:
        return f"Secret({self.source}: {MASK})"

    __str__ = __repr__


def expand(value: str, environ: Mapping[str, str] | None = None) -> Secret:
    """A key from its config text; ``ValueError`` (naming variables, never values)
    when a variable is missing or the result cannot be a header's token."""
    env = os.environ if environ is None else environ
    names = _VARIABLE.findall(value)
    for name in names:
        if not _NAME.fullmatch(name):
            raise ValueError(f"${{{name}}} is not an environment variable name")
        if name not in env:
            raise ValueError(f"environment variable {name} is not set")
    text = _VARIABLE.sub(lambda m: env[m.group(1)], value)
    source = ", ".join(f"${{{name}}}" for name in names) or "literal"
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raw = b"\x00"
    if not raw:
        raise ValueError(f"is empty ({source})")
    if not _TOKEN.fullmatch(raw):
        raise ValueError(
            f"must be printable ASCII without spaces ({source}; the value is not shown)"
        )
    return Secret(raw, source)


def matching(offered: bytes, keys: Iterable[Secret]) -> Secret | None:
    """The first of ``keys`` that ``offered`` is, in time that does not depend on how
    much of a key it got right (every key is compared, a match or not)."""
    found = None
    for key in keys:
        if hmac.compare_digest(offered, key.value) and found is None:
            found = key
    return found


def mask_url(url: str) -> str:
    """A URL fit to show: ``http://user:****@host`` for one that carries a password
    (every URL of a text, each ending at a space or a quote)."""
    return _PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", url)


def shown_url(url: str) -> str:
    """One URL fit to quote whole: all between ``//`` and its last ``@`` hidden but a
    user name before a ``:``, whatever the password holds (spaces and quotes too)."""
    head, slashes, rest = url.partition("//")
    userinfo, at, host = rest.rpartition("@")
    if not slashes or not at:
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{head}//{user}:{MASK}@{host}" if colon else f"{head}//{MASK}@{host}"


RawHeaders = Sequence[tuple[bytes, Sequence[bytes]]]
"""A request's headers as twisted.web keeps them: each name with its values."""


def offered(headers: RawHeaders) -> Iterator[bytes]:
    """Every key a request's head offers: each ``Authorization: Bearer`` token and each
    ``X-Api-Key`` value, stripped of surrounding spaces."""
    for name, values in headers:
        lower = name.lower()
        if lower == b"authorization":
            for value in values:
                parts = value.split(None, 1)
                if len(parts) == 2 and parts[0].lower() == b"bearer":
                    yield parts[1].strip()
        elif lower == b"x-api-key":
            for value in values:
                yield value.strip()


def holds_key(headers: RawHeaders, keys: Iterable[Secret]) -> bool:
    """Whether the head offers one of ``keys`` (each offer compared in constant time)."""
    return key_held(headers, tuple(keys)) is not None


def key_held(headers: RawHeaders, keys: Sequence[Secret]) -> Secret | None:
    """The first of ``keys`` the head's first good offer matches: each offer is compared
    with every key, in time that does not depend on how much of one it got right."""
    for value in offered(headers):
        found = matching(value, keys)
        if found is not None:
            return found
    return None

"""``shared_state``: the Redis (or Valkey) store that crossbar replicas on several machines
share one count of the fleet's slots through.

Written as a URL, ``redis://[:PASSWORD@]HOST[:PORT][/DB]``; the password may name
environment variables as ``${NAME}``, as a key does, so that the file itself can be
shared. Every crossbar of one fleet names the same store and database; two fleets use two
databases (or two stores).
"""

from __future__ import annotations

import re

import attrs

from crossbar.config.secrets import MASK, Secret, expand

DEFAULT_PORT = 6379
_URL = re.compile(
    r"redis://(?:(?P<user>[^:@/]*)?:(?P<password>[^@/]*)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d{1,5}))?(?:/(?P<db>\d{1,5})?)?"
)


@attrs.frozen
class SharedState:
    """Where the shared count is kept: a Redis server and database."""

    host: str
    port: int = DEFAULT_PORT
    db: int = 0
    password: Secret | None = None
    username: str | None = None

    @property
    def shown(self) -> str:
        """The URL fit to show: a password, if any, masked."""
        auth = "" if self.password is None else f"{self.username or ''}:{MASK}@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{auth}{host}:{self.port}/{self.db}"


def parse_shared_state(value: object) -> SharedState:
    """A ``redis://`` URL; ``ValueError`` naming the problem (never the password)."""
    if not isinstance(value, str):
        raise ValueError(f"must be a redis:// URL, not {type(value).__name__}")
    match = _URL.fullmatch(value.strip())
    if match is None:
        hint = (
            ""
            if value.startswith("redis://")
            else " (rediss:// and unix sockets are not supported)"
        )
        raise ValueError(f"must be redis://HOST[:PORT][/DB]{hint}")
    port = int(match["port"] or DEFAULT_PORT)
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be 1-65535, not {port}")
    password = None
    if match["password"] is not None:
        password = expand(match["password"])
    host = match["host"].strip("[]")
    return SharedState(host, port, int(match["db"] or 0), password, match["user"] or None)

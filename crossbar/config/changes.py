"""What a reload changes: the difference between the config in force and a new one,
decided before anything running is touched.

Pure: the service applies a :class:`Changes` to the health table, the poller, the pools
and the pages; the words an admin reads about it are made here.
"""

from __future__ import annotations

import attrs

from crossbar.config.fields import shown_listen
from crossbar.config.model import Config, HostConfig
from crossbar.config.sharedstate import SharedState

FIXED = (
    "listen",
    "listen_reuse_port",
    "workers",
    "status_listen",
    "log_format",
    "usage_db",
    "shared_state",
)
"""Keys a reload cannot apply: ports are open and processes, the log observer and the
usage store are set up once, at start. A change to one is said and the old value kept."""


@attrs.frozen
class Changes:
    """From ``old`` to ``config``: which hosts come, go, change address or stay."""

    config: Config
    """The new config as it will be in force: the keys of :data:`FIXED` as they were."""
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    readdressed: tuple[str, ...] = ()
    """Hosts whose name stays but whose URL or CA changed: a new host under an old name,
    whose state starts ``unknown`` and whose pooled connections are not reused."""
    ignored: tuple[str, ...] = ()
    """One sentence per key of :data:`FIXED` that changed and was kept."""
    routes_added: tuple[str, ...] = ()
    routes_removed: tuple[str, ...] = ()
    routes_changed: tuple[str, ...] = ()
    hosts_retuned: tuple[str, ...] = ()
    """Hosts at the same address with other settings, key or slots."""
    other: tuple[str, ...] = ()
    """The top-level keys, other than hosts and routes, whose value changed."""

    def summary(self) -> str:
        """One line: what changed, by name, never by value (keys may be secret)."""
        parts = []
        for what, names in (
            ("hosts added", self.added),
            ("hosts removed", self.removed),
            ("hosts with a new address", self.readdressed),
            ("hosts with new settings", self.hosts_retuned),
            ("routes added", self.routes_added),
            ("routes removed", self.routes_removed),
            ("routes changed", self.routes_changed),
            ("settings changed", self.other),
        ):
            if names:
                parts.append(f"{what}: {', '.join(names)}")
        return "; ".join(parts) if parts else "nothing changed"


_TOP_LEVEL = (
    "defaults",
    "limits",
    "status_keys",
    "drain_timeout",
    "trusted_proxies",
    "usage_retention",
)
"""Top-level keys that a reload applies and names when they change (``api_keys`` live
in the routes, whose change is named with them)."""


def compare(old: Config, new: Config) -> Changes:
    """The changes from ``old`` to ``new``, with the keys of :data:`FIXED` kept."""
    ignored = []
    kept = {}
    for key in FIXED:
        before, after = getattr(old, key), getattr(new, key)
        if before != after:
            ignored.append(
                f"{key} changed from {_shown(key, before)} to {_shown(key, after)}: "
                "a reload cannot apply it, restart crossbar for that"
            )
            kept[key] = before
    config = attrs.evolve(new, **kept) if kept else new
    stay = [name for name in new.hosts if name in old.hosts]
    readdressed = [n for n in stay if moved(old.hosts[n], new.hosts[n])]
    retuned = [
        n
        for n in stay
        if n not in readdressed
        and (old.hosts[n] != new.hosts[n] or old.settings.get(n) != new.settings.get(n))
    ]
    return Changes(
        config=config,
        added=tuple(n for n in new.hosts if n not in old.hosts),
        removed=tuple(n for n in old.hosts if n not in new.hosts),
        readdressed=tuple(readdressed),
        hosts_retuned=tuple(retuned),
        ignored=tuple(ignored),
        routes_added=tuple(n for n in new.routes if n not in old.routes),
        routes_removed=tuple(n for n in old.routes if n not in new.routes),
        routes_changed=tuple(
            n for n in new.routes if n in old.routes and old.routes[n] != new.routes[n]
        ),
        other=tuple(k for k in _TOP_LEVEL if getattr(old, k) != getattr(new, k)),
    )


def moved(old: HostConfig, new: HostConfig) -> bool:
    """Whether a host's name now stands for another machine: what makes it the same one
    is where it is and whom its certificate is from."""
    return (old.url, old.tls_ca) != (new.url, new.tls_ca)


def _shown(key: str, value: object) -> str:
    if key in ("listen", "status_listen") and isinstance(value, str):
        return shown_listen(value)
    if isinstance(value, SharedState):
        return value.shown  # its password masked
    if isinstance(value, bool):
        return "true" if value else "false"  # as YAML writes it
    return "none" if value is None else str(value)


@attrs.frozen
class Reloaded:
    """How a reload went, for the one who asked (``POST /_crossbar/reload``)."""

    ok: bool
    message: str
    """The log line's words: what changed, or why the config was refused."""
    ignored: tuple[str, ...] = ()
    """Changes a reload cannot apply (``listen``, ``workers``, ...), one sentence each."""
    conflict: bool = False
    """Refused for what crossbar is doing or is (stopping, a demo with no file), whatever
    the config says."""


class Reloads:
    """This process's reloads, for the status pages and the metrics."""

    def __init__(self, loaded_at: float) -> None:
        self.loaded_at = loaded_at
        """When the config in force was read (a refused reload leaves it)."""
        self.ok = 0
        self.refused = 0
        self.last_refused: tuple[float, str] | None = None
        """When the last refused reload was, and why; cleared by one that is applied."""

    def applied(self, now: float) -> None:
        self.ok += 1
        self.loaded_at = now
        self.last_refused = None

    def failed(self, now: float, reason: str) -> None:
        self.refused += 1
        self.last_refused = (now, reason)

    def to_json(self) -> dict[str, object]:
        refused = self.last_refused
        return {
            "loaded_at": self.loaded_at,
            "ok": self.ok,
            "refused": self.refused,
            "last_refused": None if refused is None else {"at": refused[0], "reason": refused[1]},
        }

"""What a key may ask of a fleet beside its slots: which models (a route's and a named
key's ``models:``, glob patterns), and how many model loads a minute
(``max_loads_per_minute``). Pure rules, no I/O: the caller gives the time.

A model load costs a fleet far more than a request: tens of seconds of a GPU, and the
evicted model's prompt cache. A key that may name any model can evict other teams'
models at will; these rules let an admin say which models a route or a key may ask for,
and how often a key's requests may make a host load one.
"""

from __future__ import annotations

from collections import deque
from fnmatch import fnmatchcase

from crossbar.config import RouteConfig
from crossbar.config.secrets import KeyHolder

LOAD_WINDOW = 60.0
"""Seconds over which a key's loads are counted against ``max_loads_per_minute``."""
_SHOWN = 64
"""Characters of a client's model name quoted back."""


def allows(patterns: tuple[str, ...], model: str) -> bool:
    """Whether ``model`` matches one of ``patterns`` (case-sensitive globs: ``*``, ``?``,
    ``[ab]``); no patterns allow every model."""
    return not patterns or any(fnmatchcase(model, pattern) for pattern in patterns)


def refused_model(route: RouteConfig, holder: KeyHolder | None, model: str | None) -> str | None:
    """Why a request for ``model`` (the one it will be sent with: the body's, else the
    route's default) is refused on ``route`` for the key's ``holder``: words for a 403, or
    ``None`` when it may go. A request naming no model is not refused here."""
    if model is None:
        return None
    if not allows(route.models, model):
        return f"model {_shown(model)} is not served on route {route.name}"
    if holder is not None and not allows(holder.models, model):
        return f"model {_shown(model)} is not allowed for key {holder.name}"
    return None


class LoadBudget:
    """Model loads each named key's requests caused in the last :data:`LOAD_WINDOW`
    seconds, held to its ``max_loads_per_minute``. Only keys with a limit are counted,
    each at most its limit of times: memory is bounded by the config."""

    def __init__(self, window: float = LOAD_WINDOW) -> None:
        self.window = window
        self._loads: dict[str, deque[float]] = {}

    def refusal(self, holder: KeyHolder | None, now: float) -> str | None:
        """Words for a 429 when a request of ``holder``'s that would make a host load a
        model is one load too many now; ``None`` when it may go."""
        most = None if holder is None else holder.max_loads_per_minute
        if holder is None or most is None:
            return None
        times = self._recent(holder.name, now)
        if len(times) < most:
            return None
        wait = max(1, round(times[0] + self.window - now))
        loads = "model load" if most == 1 else "model loads"
        return (
            f"key {holder.name}: {most} {loads} in the last minute already "
            f"(max_loads_per_minute); try again in {wait} s"
        )

    def retry_after(self, holder: KeyHolder | None, now: float) -> int:
        """Seconds until ``holder``'s oldest load of the last minute no longer counts
        (at least 1): when a load refused now may be asked for again."""
        times = self._recent(holder.name, now) if holder is not None else None
        return max(1, round(times[0] + self.window - now)) if times else 1

    def count(self, holder: KeyHolder | None, now: float) -> None:
        """A request of ``holder``'s made a host load a model (or start loading it)."""
        if holder is None or holder.max_loads_per_minute is None:
            return
        times = self._recent(holder.name, now)
        times.append(now)
        while len(times) > holder.max_loads_per_minute:
            times.popleft()

    def loads(self, name: str, now: float) -> int:
        """Loads the key named ``name`` caused in the last minute."""
        return len(self._recent(name, now))

    def _recent(self, name: str, now: float) -> deque[float]:
        times = self._loads.setdefault(name, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times


def _shown(model: str) -> str:
    """A client's model name quoted back: printable, and short."""
    text = "".join(c if c.isprintable() else "?" for c in model[: _SHOWN + 1])
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")

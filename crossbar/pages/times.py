"""Times as the pages show them: RFC 3339 for machines, "3 s ago" and "3 h 12 min" for
people, a time to first byte in the unit it reads best in. Pure, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def ago(seconds: float) -> str:
    """A short, rounded-down age: ``"3 s ago"``, ``"4 min ago"``, ``"2 h ago"``, ``"5 d ago"``."""
    s = max(0, int(seconds))
    size, name = next((u for u in _UNITS if s >= u[0]), _UNITS[-1])
    return f"{s // size} {name} ago"


def duration(seconds: float) -> str:
    """A rounded-down span in its two largest units: ``"42 s"``, ``"12 min"``,
    ``"3 h 12 min"``, ``"2 d 5 h"``; an uptime read at a glance needs no more."""
    s = max(0, int(seconds))
    if s < 3600:
        return ago(s)[: -len(" ago")]
    big, name = _UNITS[0] if s >= 86400 else _UNITS[1]
    small, small_name = _UNITS[1] if s >= 86400 else _UNITS[2]
    return f"{s // big} {name} {s % big // small} {small_name}"


def short_seconds(seconds: float) -> str:
    """A time to first byte as a person reads it: ``"0.45 ms"``, ``"42 ms"``, ``"1.5 s"``,
    ``"120 s"``; the value is already rounded to two significant digits."""
    if seconds < 0.001:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s"

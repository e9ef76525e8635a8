"""The access log's one line per request: what an admin reads and greps for.

Built as one string and logged as one field: the logger's own formatting costs more per
line. Pure rules, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from crossbar.server.rewrite import printable


def access_line(
    route: str,
    host: str | None,
    method: bytes | None,
    path: bytes,
    status: int,
    seconds: float,
    *,
    cut_off: bool = False,
    client_left: bool = False,
    tried: Sequence[str] = (),
    moved_from: str | None = None,
    note: str | None = None,
) -> str:
    """``opencode gpu-b POST /v1/chat/completions 200 840ms``, then what went unusually:
    an answer cut off or a client that left, the hosts tried when more than one, and the
    home host a ``cache_affinity`` conversation was moved from (``note``, when given,
    is :func:`access_note`'s already)."""
    if note is None:
        note = access_note(cut_off, client_left, tried, moved_from)
    shown, where = printable(method or b"-", 16), printable(path, 200)
    return f"{route} {host or '-'} {shown} {where} {status} {seconds * 1000:.0f}ms{note}"


def access_note(
    cut_off: bool, client_left: bool, tried: Sequence[str], moved_from: str | None
) -> str:
    """The end of the access line: `` (client left) (tried gpu-a, gpu-b)``, or empty."""
    note = " (answer cut off)" if cut_off else " (client left)" if client_left else ""
    if len(tried) > 1:
        note += f" (tried {', '.join(tried)})"
    if moved_from is not None:
        note += f" (moved from {moved_from})"
    return note

"""The front door's rules: what a request's head alone decides, before its body is
read. Pure: every rule takes bytes and headers and says yes, or how to refuse."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs


@attrs.frozen
class Refusal:
    """How to turn a request away: a status, a JSON ``{"error": ...}``, extra headers,
    and whether the connection is closed after it (when what follows cannot be trusted
    to be the next request)."""

    status: int
    error: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
    close: bool = False


RawHeaders = Sequence[tuple[bytes, Sequence[bytes]]]
"""A request's headers as twisted.web keeps them: each name with its values."""

Guard = Callable[[bytes, RawHeaders], Refusal | None]
"""A rule over a request's path (without query) and headers, applied when the head is
complete: ``None`` lets it in."""

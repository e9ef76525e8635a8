"""Server-sent events as bytes, for reading an answer's usage from a stream's tail: an
event's fields, and the events that carry a key, found without reading the others.
Pure, no I/O (the reader is :mod:`crossbar.usage.reader`)."""

from __future__ import annotations

import re
from collections.abc import Iterator

_OBJECT_AFTER = rb'"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})'
WINDOW = 4096
"""How far past its key an object read from a cut event's end may reach."""


def fields(event: bytes) -> tuple[bytes, bytes]:
    """An event's name and its data lines joined, as server-sent events define them."""
    name = b""
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, b"\n".join(data)


def events_with(tail: bytes, keys: tuple[bytes, ...]) -> Iterator[tuple[int, bytes]]:
    """The events of ``tail`` (``\\n``-ended lines, events apart by a blank line) that hold
    any of ``keys``, in order, each with where it starts: 0 for the first, which begins
    where the tail does (inside an event, if the tail was cut from a longer stream).
    Found with ``bytes.find``: a stream's tail holds dozens of events, one or two of them
    with usage."""
    starts = set()
    for key in keys:
        at = tail.find(key)
        while at >= 0:
            before = tail.rfind(b"\n\n", 0, at)
            starts.add(0 if before < 0 else before + 2)
            at = tail.find(key, at + len(key))
    for start in sorted(starts):
        end = tail.find(b"\n\n", start)
        yield start, tail[start:] if end < 0 else tail[start:end]


def trailing_objects(cut: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The last ``usage`` and ``timings`` objects in ``cut``, the end of an event longer
    than the tail (a Responses ``response.completed`` repeats the whole answer): each key
    found, with its object's JSON text."""
    for key, pattern in _TRAILING.items():
        at = cut.rfind(b'"' + key + b'"')
        found = pattern.match(cut[at : at + WINDOW]) if at >= 0 else None
        if found is not None:
            yield key, found.group(1)


_TRAILING = {key: re.compile(rb'"' + key + _OBJECT_AFTER) for key in (b"usage", b"timings")}

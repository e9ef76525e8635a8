"""Model lists of a chosen length, as a host's ``/v1/models`` body, for the list reader's tests."""

from __future__ import annotations


def ids(count: int) -> bytes:
    """``count`` ids of six digits, 16 bytes an entry: 520,000 fit in 8 MiB."""
    return b'{"data":[' + b",".join(b'{"id":"%06d"}' % i for i in range(count)) + b"]}"

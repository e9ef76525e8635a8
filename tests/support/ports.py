"""Whether a local port refuses connections: nothing torn down is left listening."""

from __future__ import annotations

import socket


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0

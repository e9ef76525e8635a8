"""The access log's one line per request: what an admin reads and greps for.

Built as one string from the request's record and logged as one field: the logger's own
formatting costs more per line. Pure rules, no I/O (the observer that logs the line is
:class:`crossbar.server.accesslog.AccessLog`).
"""

from __future__ import annotations

from crossbar.fleet.record import RequestRecord
from crossbar.server.rewrite import printable


def access_line(record: RequestRecord) -> str:
    """``opencode gpu-b POST /v1/chat/completions 200 840ms``, then what went unusually:
    `` (client left) (tried gpu-a, gpu-b) (moved from gpu-c)``."""
    shown, where = printable(record.method or b"-", 16), printable(record.path, 200)
    notes = "".join(f" ({note})" for note in record.notes())
    took = f"{record.status} {record.seconds * 1000:.0f}ms"
    return f"{record.route} {record.host or '-'} {shown} {where} {took}{notes}"

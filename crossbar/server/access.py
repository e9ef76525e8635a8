"""The access log's one line per request: what an admin reads and greps for.

Built as one string from the request's record and logged as one field: the logger's own
formatting costs more per line. Pure rules, no I/O (the observer that logs the line is
:class:`crossbar.server.accesslog.AccessLog`).
"""

from __future__ import annotations

from crossbar.fleet.record import RequestRecord
from crossbar.server.rewrite import printable


def access_line(record: RequestRecord) -> str:
    """``opencode gpu-b POST /v1/chat/completions 200 840ms``, then who asked and what the
    answer reported, each where known (``key=alice prompt_tokens=1200 cached_tokens=1024
    completion_tokens=85 ttft_ms=312 tok_s=41.3``, named as in the JSON log), then what
    went unusually: `` (client left) (tried gpu-a, gpu-b) (moved from gpu-c)``."""
    shown, where = printable(record.method or b"-", 16), printable(record.path, 200)
    notes = "".join(f" ({note})" for note in record.notes())
    took = f"{record.status} {record.seconds * 1000:.0f}ms"
    return f"{record.route} {record.host or '-'} {shown} {where} {took}{_usage(record)}{notes}"


def _usage(record: RequestRecord) -> str:
    """The usage fields of a line, each `` name=value``; rounded as the JSON log rounds."""
    text = "" if record.key is None else f" key={record.key}"
    if record.prompt_tokens is not None:
        text += f" prompt_tokens={record.prompt_tokens}"
    if record.cached_tokens is not None:
        text += f" cached_tokens={record.cached_tokens}"
    if record.generated_tokens is not None:
        text += f" completion_tokens={record.generated_tokens}"
    if record.first_token is not None:
        text += f" ttft_ms={round(record.first_token * 1000)}"
    if record.tokens_per_second is not None:
        text += f" tok_s={round(record.tokens_per_second, 1)}"
    return text

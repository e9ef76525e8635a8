"""The access log's one line per request: what an admin reads and greps for.

Built as one string from the request's record and logged as one field: the logger's own
formatting costs more per line. Pure rules, no I/O (the observer that logs the line is
:class:`crossbar.stats.accesslog.AccessLog`).
"""

from __future__ import annotations

import re

from crossbar.stats.record import RequestRecord


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
    if record.asked_model is not None:  # an alias: the name sent, and the model served
        asked = printable(record.asked_model.encode(), ALIAS_CHARS)
        text += f" model={asked}->{printable((record.model or '-').encode(), ALIAS_CHARS)}"
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


ALIAS_CHARS = 100
"""Characters of a model's name on a line: a name an alias matched is the client's text."""
_VISIBLE = re.compile(rb"[\x21-\x7e]*")


def printable(raw: bytes, limit: int) -> str:
    """What a client sent, fit for one log line: bytes outside printable ASCII escaped
    (``\\xNN``), at most ``limit`` characters, and ``...`` when cut.

    Made once for what comes again and again (a handful of methods and paths, two of them
    on every line): a text that was short enough never to be cut is remembered."""
    text = _SHOWN.get(raw)
    if text is not None and len(text) <= limit:
        return text
    if _VISIBLE.fullmatch(raw):
        text = raw.decode("ascii")
    else:
        text = "".join(chr(b) if 0x21 <= b <= 0x7E else f"\\x{b:02x}" for b in raw[:limit])
    if 4 * len(raw) <= limit:  # escaped or not, never cut: the same text for any limit
        if len(_SHOWN) >= SHOWN_KEPT:
            _SHOWN.clear()
        _SHOWN[raw] = text
    return text if len(text) <= limit else text[: limit - 3] + "..."


SHOWN_KEPT = 256
"""At most this many texts are remembered: a client that sends ever new paths only makes
the table start again."""


_SHOWN: dict[bytes, str] = {}

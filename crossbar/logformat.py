"""``log_format: json``: crossbar's own log lines as one JSON object each, for machines.

The lines still go where twistd's options send them (``--logfile``, ``--syslog``, ``-n``);
only how each event is written changes. The request and host lines carry their fields
in the event itself (``access``, ``host_state``), so nothing is parsed back out of text,
and the text form pays only for a tuple.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from twisted.logger import FileLogObserver, ILogObserver, LogEvent, eventAsText
from zope.interface import implementer

from crossbar.server.rewrite import printable


def json_line(event: LogEvent) -> str | None:
    """The event as one line of JSON: a request, a host transition, a reload, or a message
    in words (with its traceback, if any, inside the text); ``None`` for an event with no
    words."""
    access = event.get("access")
    state = event.get("host_state")
    if access is not None:
        fields = _request(access)
    elif state is not None:
        reason = event.get("reason")
        fields = {
            "event": "host",
            "host": event.get("name"),
            "state": state,
            "reason": None if reason is None else str(reason),
        }
    else:
        text = eventAsText(event, includeTimestamp=False, includeSystem=False)
        if not text:
            return None
        reload = event.get("reload")
        if reload is not None:  # "ok" or "refused"; the text says what changed, or why not
            fields = {"event": "reload", "result": reload, "text": text}
        else:
            system = event.get("log_system") or event.get("log_namespace", "-")
            fields = {"event": "message", "system": system, "text": text}
    level = event.get("log_level")
    head = {"time": _time(event.get("log_time")), "level": getattr(level, "name", None)}
    return json.dumps(head | fields, separators=(",", ":")) + "\n"


def _request(access: tuple[Any, ...]) -> dict[str, object]:
    """The access tuple (as :mod:`crossbar.server.exchange` logs it) as named fields."""
    route, host, model, method, path, status, seconds, first_byte, sent, note = access
    return {
        "event": "request",
        "route": route,
        "host": host,
        "model": model,
        "method": printable(method or b"-", 16),
        "path": printable(path, 200),
        "status": status,
        "ms": round(seconds * 1000),
        "ttfb_ms": None if first_byte is None else round(first_byte * 1000),
        "bytes": sent,
        # " (client left) (tried gpu-a, gpu-b)" -> "client left; tried gpu-a, gpu-b"
        "note": note.strip()[1:-1].replace(") (", "; ") if note else None,
    }


def _time(when: object) -> str | None:
    if not isinstance(when, int | float):
        return None
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")


def as_json(observer: ILogObserver) -> ILogObserver:
    """``observer`` (one twistd made) writing JSON lines instead of text.

    A file's observer gets the JSON formatter in place of twistd's text one, so each
    line of the file is a JSON object; any other (syslog's) gets the JSON as the
    event's words, under its own prefix.
    """
    if isinstance(observer, FileLogObserver):
        observer.formatEvent = json_line
        return observer
    return _JSONWords(observer)


@implementer(ILogObserver)
class _JSONWords:
    """Hands each event on with its JSON line as its only words."""

    def __init__(self, observer: ILogObserver) -> None:
        self._observer = observer

    def __call__(self, event: LogEvent) -> None:
        line = json_line(event)
        if line is None:
            return
        # A fresh event: an old-style one's own words ("message") would win over ours.
        words = {k: event[k] for k in _KEPT if k in event}
        if "log_failure" in event:
            words["isError"] = 1  # syslog's priority for an error
        self._observer(words | {"log_format": "{log_json}", "log_json": line.rstrip("\n")})


_KEPT = ("log_time", "log_level", "log_namespace", "log_system", "log_logger", "log_source")

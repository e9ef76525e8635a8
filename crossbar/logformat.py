"""How crossbar's log lines are written: as twistd's text, or with ``log_format: json`` as
one JSON object each, for machines; to a file a batch at a time.

The lines still go where twistd's options send them (``--logfile``, ``--syslog``, ``-n``);
only how each event is written changes. The request and host lines carry their fields
in the event itself (a request's record in ``access``, ``host_state``), so nothing is
parsed back out of text, and the text form pays nothing for them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import (
    FileLogObserver,
    ILogObserver,
    LogEvent,
    LogLevel,
    eventAsText,
    formatEventAsClassicLogText,
    formatTime,
    timeFormatRFC3339,
)
from zope.interface import implementer

from crossbar.stats import ALIAS_CHARS, RequestRecord, printable


def json_line(event: LogEvent) -> str | None:
    """The event as one line of JSON: a request, a host transition, a reload, or a message
    in words (with its traceback, if any, inside the text); ``None`` for an event with no
    words."""
    relayed = event.get("worker_json")
    if relayed is not None:  # another worker's line, already an object: as it came
        return _encode(relayed) + "\n"
    access = event.get("access")
    if type(access) is RequestRecord:  # most lines: made in one go
        return _encode(_request(access, event)) + "\n"
    state = event.get("host_state")
    if state is not None:
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
    return _encode(head | fields) + "\n"


_JSON = json.JSONEncoder(separators=(",", ":"))
"""``json.dumps`` with these separators, without making an encoder for every line."""
_FAST = msgspec.json.Encoder()


def _encode(fields: dict[str, Any] | _RequestLine) -> str:
    """``fields`` as compact JSON in ASCII, the very text of the ``json`` module. msgspec
    writes it in a seventh of the time and the same text for printable ASCII; a line with
    anything else in it (a model's name, a message: other characters, or DEL, which
    msgspec leaves as it is) is written again by ``json``, which escapes them."""
    line = _FAST.encode(fields).decode()
    if line.isascii() and "\x7f" not in line:
        return line
    return _JSON.encode(fields if isinstance(fields, dict) else msgspec.structs.asdict(fields))


class _RequestLine(msgspec.Struct):
    """A request's line, its fields in the order they are written. A struct, not a dict:
    made and written in a third of a dict's instructions, on every request's path."""

    time: str | None
    level: str | None
    event: str
    route: str
    host: str | None
    model: str | None
    asked_model: str | None
    method: str
    path: str
    status: int
    ms: int
    ttfb_ms: int | None
    bytes: int
    wait_ms: int | None
    key: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_ms: int | None
    tok_s: float | None
    note: str | None


def _request(record: RequestRecord, event: LogEvent) -> _RequestLine:
    """A request's line: its record (as :class:`~crossbar.stats.accesslog.AccessLog` logs
    it) as named fields, its model as the access log shows it (``other`` when no host
    lists it)."""
    first_byte, waited, first_token = record.first_byte, record.waited, record.first_token
    speed = record.tokens_per_second
    # Most requests went as asked: their notes (a list, made) are looked for only if not.
    unusual = record.cut_off or record.client_left or len(record.tried) > 1
    unusual = unusual or bool(record.failures)
    unusual = unusual or record.moved_from is not None or waited is not None
    unusual = unusual or record.reason is not None or record.size_note is not None
    return _RequestLine(
        _time(event.get("log_time")),
        getattr(event.get("log_level"), "name", None),
        "request",
        record.route,
        record.host,
        event.get("access_model"),
        None if record.asked_model is None else record.asked_model[:ALIAS_CHARS],
        printable(record.method or b"-", 16),
        printable(record.path, 200),
        record.status,
        round(record.seconds * 1000),
        None if first_byte is None else round(first_byte * 1000),
        record.sent,
        None if waited is None else round(waited * 1000),
        record.key,
        record.prompt_tokens,
        record.cached_tokens,
        record.generated_tokens,
        None if first_token is None else round(first_token * 1000),
        None if speed is None else round(speed, 1),
        "; ".join(record.notes()) if unusual else None,
    )


def _time(when: object) -> str | None:
    """``when`` as ``datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")``
    writes it, with the text of its second made once per second (a third of a line's cost)."""
    if type(when) is not float:
        if not isinstance(when, int):
            return None
        when = float(when)
    if when < 0:
        return _iso(when)
    second = int(when)
    micro = round((when - second) * 1e6)  # as datetime rounds: half to even
    if micro >= 1_000_000:
        return _iso(when)
    if second != _SECOND[0]:
        _SECOND[:] = [second, _iso(second)[:19]]
    text: str = _SECOND[1]
    return text + _MILLIS[micro // 1000]


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")


_SECOND: list[Any] = [-1, ""]
"""The last second seen, and its text."""
_MILLIS = [f".{ms:03d}+00:00" for ms in range(1000)]


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


# -- twistd's file observer, cheaper per line ------------------------------------------------


def writer(observer: ILogObserver, log_format: str, reactor: Any) -> ILogObserver:
    """``observer`` (one twistd made) as crossbar logs through it.

    A file's observer (``--logfile``, ``-n``) gets its lines from :class:`TwistdText` or
    :func:`json_line` and its writes in batches (:class:`Batches`, batching while the
    reactor runs and not stopping); any other (syslog's) is left as it is, or given the
    JSON as its words.
    """
    if not isinstance(observer, FileLogObserver):
        return as_json(observer) if log_format == "json" else observer
    batches = Batches(observer, json_line if log_format == "json" else TwistdText(), reactor)
    reactor.callWhenRunning(batches.start, reactor)
    return batches


class TwistdText:
    """An event as twistd's text file observer writes it, byte for byte, for less.

    twistd formats every line with ``string.Formatter``, a time-zone lookup and
    ``strftime``, about 10 µs. Here the time's text is made once per second, and the
    request line, already text in the event (``request``, with its fields in
    ``access``), is written as it is; any other event goes through twistd's formatter.
    """

    def __init__(self) -> None:
        self._second = -1
        self._stamp = "-"

    def __call__(self, event: LogEvent) -> str | None:
        request = event.get("request")
        if (
            type(request) is not str
            or event.get("access") is None
            or event.get("log_format") != "{request}"
            or "log_system" in event
            or "log_failure" in event
        ):
            return formatEventAsClassicLogText(event, self.time)
        level = event.get("log_level")
        name = "-" if level is None else level.name
        namespace = event.get("log_namespace", "-")
        text = request.replace("\n", "\n\t")
        return f"{self.time(event.get('log_time'))} [{namespace}#{name}] {text}\n"

    def time(self, when: float | None) -> str:
        """twistd's timestamp (RFC 3339 to the second, local time zone) for ``when``."""
        if type(when) is not float:
            return formatTime(when, timeFormatRFC3339)
        second = int(when)
        if not 0.0 <= when - second <= 0.999999:  # may round to the next second (or < 0)
            return formatTime(when, timeFormatRFC3339)
        if second != self._second:
            self._second, self._stamp = second, formatTime(when, timeFormatRFC3339)
        return self._stamp


@implementer(ILogObserver)
class Batches:
    """Lines written to a file's observer a batch at a time, not one by one.

    Each line is one write and one flush to twistd's file, a system call per request.
    Once :meth:`start`, lines wait at most ``every`` seconds (or until ``most``
    characters wait), and a warning, error or critical line goes out at once with those before
    it. From the reactor's shutdown on, every line is written at once again, so the
    last lines of a stop are never lost; so is a line logged by a thread other than the
    reactor's (the batch and its timer are the reactor's own). ``observer``'s
    ``formatEvent`` is taken over.
    A log file rotated (``SIGUSR1``, or by size) gets the lines written after it.
    """

    def __init__(
        self,
        observer: FileLogObserver,
        line: Callable[[LogEvent], str | None],
        clock: IReactorTime,
        every: float = 0.1,
        most: int = 65536,
    ) -> None:
        observer.formatEvent = _batch_text
        self._write = observer
        self._line = line
        self._clock = clock
        self._every = every
        self._most = most
        self._lines: list[str] = []
        self._size = 0
        self._timer: IDelayedCall | None = None
        self._batching = False
        self._thread = threading.get_ident()  # twistd's main thread runs the reactor

    def start(self, reactor: Any) -> None:
        """Batch from now on, until ``reactor`` begins to shut down."""
        self._batching = True
        reactor.addSystemEventTrigger("before", "shutdown", self.stop)

    def stop(self) -> None:
        """Write what waits, and every line at once from now on."""
        self._batching = False
        self.flush()

    def __call__(self, event: LogEvent) -> None:
        text = self._line(event)
        if not text:
            return
        if threading.get_ident() != self._thread:
            self._write({_BATCH: text})
            return
        self._lines.append(text)
        self._size += len(text)
        if not self._batching or self._size >= self._most or event.get("log_level") in _AT_ONCE:
            self.flush()
        elif self._timer is None:
            self._timer = self._clock.callLater(self._every, self.flush)

    def flush(self) -> None:
        """Write the lines that wait, in one write."""
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        if self._lines:
            text = "".join(self._lines)
            self._lines, self._size = [], 0
            self._write({_BATCH: text})


_AT_ONCE = (LogLevel.warn, LogLevel.error, LogLevel.critical)
_BATCH = "crossbar_batch"


def _batch_text(event: LogEvent) -> str | None:
    """The file observer's formatter under :class:`Batches`: the batch's text as it is."""
    text: str | None = event.get(_BATCH)
    return text

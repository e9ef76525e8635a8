"""``log_format: json``: crossbar's own lines as one JSON object each, the request lines,
events and failures, and the batched writer, in memory. Under a real twistd: in
``tests/system/test_logformat.py``.
"""

from __future__ import annotations

import io
import json
import random
import threading
import time
from collections.abc import Iterator

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import (
    FileLogObserver,
    Logger,
    LogLevel,
    formatEventAsClassicLogText,
    textFileLogObserver,
)

from crossbar.config import ConfigError, parse_config
from crossbar.logformat import Batches, TwistdText, as_json, json_line, writer
from crossbar.stats.record import RequestRecord, refused_record


def test_the_request_line_names_what_went_unusually() -> None:
    out = io.StringIO()
    log = Logger(namespace="crossbar.test", observer=as_json(FileLogObserver(out, str)))
    access = RequestRecord(
        "lab", "gpu-b", 200, 0.8404, 0.0123, 512, method=b"POST", path=b"/v1/x\x00",
        tried=("gpu-a", "gpu-b"), client_left=True,
    )  # fmt: skip
    log.info("{request}", request="the text line", access=access)
    line = json.loads(out.getvalue())
    assert (line["path"], line["ms"], line["ttfb_ms"], line["bytes"]) == (
        "/v1/x\\x00",
        840,
        12,
        512,
    )
    assert line["note"] == "client left; tried gpu-a, gpu-b"


def test_a_reload_is_an_event_of_its_own() -> None:
    out = io.StringIO()
    log = Logger(namespace="crossbar.service", observer=as_json(FileLogObserver(out, str)))
    log.warn("{line}", line="reload refused, the config in force stays: x", reload="refused")
    log.info("{line}", line="reloaded crossbar.yaml: routes changed: lab", reload="ok")
    refused, applied = (json.loads(line) for line in out.getvalue().splitlines())
    assert refused == {
        "time": refused["time"],
        "level": "warn",
        "event": "reload",
        "result": "refused",
        "text": "reload refused, the config in force stays: x",
    }
    assert (applied["result"], applied["text"]) == (
        "ok",
        "reloaded crossbar.yaml: routes changed: lab",
    )


def test_a_failure_is_one_line_with_its_traceback_inside() -> None:
    out = io.StringIO()
    log = Logger(namespace="crossbar.test", observer=as_json(FileLogObserver(out, str)))
    try:
        raise ValueError("boom")
    except ValueError:
        log.failure("crossbar: unexpected error handling a request")
    [line] = out.getvalue().splitlines()
    words = json.loads(line)
    assert words["event"] == "message" and words["level"] == "critical"
    assert (
        "unexpected error handling a request" in words["text"]
        and "ValueError: boom" in words["text"]
    )


def test_syslog_gets_the_json_as_its_words() -> None:
    seen: list[dict[str, object]] = []
    log = Logger(namespace="crossbar.test", observer=as_json(seen.append))
    log.info("host {name} is up", name="gpu-a", host_state="up")
    text = formatEventAsClassicLogText(seen[0]) or ""
    assert json.loads(text.split("] ", 1)[1])["state"] == "up"


def test_log_format_is_text_or_json() -> None:
    base = {"hosts": {"gpu-a": "http://127.0.0.1:1"}, "routes": {"lab": {"hosts": ["gpu-a"]}}}
    assert parse_config(base).log_format == "text"
    assert parse_config(base | {"log_format": "json"}).log_format == "json"
    with pytest.raises(ConfigError, match="log_format: must be one of text, json, not 'xml'"):
        parse_config(base | {"log_format": "xml"})


# -- the text lines: twistd's to the byte, written in batches ----------------------------------


EXAMPLE = 1796136869.0  # 2026-12-01T14:54:29Z


SUMMER = 1774746000.0  # 2026-03-29T01:00:00Z: clocks go forward in Berlin


TIMES = [
    EXAMPLE,
    EXAMPLE + 0.25,
    EXAMPLE + 0.999999,
    EXAMPLE + 0.9999997,  # shown as the next second: twistd rounds to the microsecond
    EXAMPLE + 1.0,
    EXAMPLE + 61.5,
    SUMMER - 0.5,
    SUMMER,
    SUMMER + 0.5,
    EXAMPLE + 2.0,
]


def _events() -> list[dict[str, object]]:
    """One of each kind crossbar logs: request lines (one with a newline in a name),
    a host's line, a failure with its traceback, an old-style line and one with no words."""
    events: list[dict[str, object]] = []
    log = Logger(namespace="crossbar.proxy.exchange", observer=events.append)
    fields = RequestRecord(
        "lab", "gpu-a", 200, 2.03, 0.4, 9, "qwen", method=b"POST", path=b"/v1/chat/completions"
    )
    log.info("{request}", request="lab gpu-a POST /v1/chat/completions 200 2030ms", access=fields)
    log.info("{request}", request="lab - GET /x 503 0ms (client left)", access=fields)
    log.info("{request}", request="odd\nroute - GET / 404 1ms", access=fields)
    log.warn("host {name} is down: {reason}", name="gpu-b", reason="refused", host_state="down")
    try:
        raise ValueError("boom")
    except ValueError:
        log.failure("crossbar: unexpected error handling a request")
    events.append({"message": ("old-style",), "log_system": "HTTPChannel,0", "log_time": 0.0})
    events.append({"log_format": "{request}", "request": "x", "access": fields, "log_system": "-"})
    events.append({"log_namespace": "crossbar.test"})  # nothing to say: no line
    return events


@pytest.fixture(params=["UTC", "Europe/Berlin", "Asia/Kolkata"])
def zone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


def test_the_text_lines_are_twistds_to_the_byte(zone: str) -> None:
    stock, ours = io.StringIO(), io.StringIO()
    twistd = textFileLogObserver(stock)  # what twistd -n and --logfile write through
    crossbar = writer(textFileLogObserver(ours), "text", MemoryReactorClock())
    for when in TIMES:
        for event in _events():
            twistd(event | {"log_time": when})
            crossbar(event | {"log_time": when})
    assert ours.getvalue() == stock.getvalue()
    if zone == "UTC":
        example = "2026-12-01T14:54:29+0000 [crossbar.proxy.exchange#info] lab gpu-a POST"
        assert f"{example} /v1/chat/completions 200 2030ms\n" in ours.getvalue()
    assert ours.getvalue().count("[crossbar.proxy.exchange#info] lab gpu-a POST") == len(TIMES)
    if zone == "Europe/Berlin":  # the offset changes with the clocks, as twistd's does
        assert "T01:59:59+0100 [" in ours.getvalue() and "T03:00:00+0200 [" in ours.getvalue()


class _File(io.StringIO):
    """A file that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)


def _running(log_format: str = "text") -> tuple[MemoryReactorClock, _File, Logger]:
    reactor, out = MemoryReactorClock(), _File()
    observer = writer(textFileLogObserver(out), log_format, reactor)
    for started, args, kwargs in reactor.whenRunningHooks:  # the reactor starts
        started(*args, **kwargs)
    return reactor, out, Logger(namespace="crossbar.test", observer=observer)


def test_while_the_reactor_runs_lines_are_written_a_batch_at_a_time() -> None:
    reactor, out, log = _running()
    for n in range(3):
        log.info("{request}", request=f"lab gpu-a GET /{n} 200 1ms", access=())
    reactor.advance(0.05)
    assert out.writes == []
    reactor.advance(0.05)
    [batch] = out.writes
    assert [line.split("] ")[1] for line in batch.splitlines()] == [
        "lab gpu-a GET /0 200 1ms",
        "lab gpu-a GET /1 200 1ms",
        "lab gpu-a GET /2 200 1ms",
    ]
    assert reactor.getDelayedCalls() == []  # nothing waits, no timer left


def test_an_error_is_written_at_once_with_the_lines_before_it() -> None:
    reactor, out, log = _running()
    log.info("{request}", request="lab gpu-a GET / 200 1ms", access=())
    log.error("host {name}: cannot connect", name="gpu-a")
    [batch] = out.writes
    assert batch.splitlines()[0].endswith("lab gpu-a GET / 200 1ms")
    assert batch.splitlines()[1].endswith("[crossbar.test#error] host gpu-a: cannot connect")
    assert reactor.getDelayedCalls() == []
    try:
        raise ValueError("boom")
    except ValueError:
        log.failure("unexpected")
    assert "ValueError: boom" in out.writes[1]


def test_a_stop_writes_what_waits_and_every_line_after_it_at_once() -> None:
    reactor, out, log = _running()
    log.info("stopping: waiting up to 30s for 1 request in flight")
    assert out.writes == []
    for stop, args, kwargs in reactor.triggers["before"]["shutdown"]:
        stop(*args, **kwargs)
    assert len(out.writes) == 1 and "stopping: waiting" in out.writes[0]
    log.info("stopped: 1 request finished")  # the drain ends later, during the shutdown
    assert len(out.writes) == 2 and "stopped: 1 request finished" in out.writes[1]


def test_before_the_reactor_runs_each_line_is_written_at_once() -> None:
    out = _File()
    log = Logger(
        namespace="crossbar.test",
        observer=writer(textFileLogObserver(out), "text", MemoryReactorClock()),
    )
    log.info("first")
    log.info("second")
    assert [w.split("] ")[1] for w in out.writes] == ["first\n", "second\n"]


def test_a_burst_is_written_without_waiting_for_the_timer() -> None:
    reactor, out = MemoryReactorClock(), _File()
    batches = Batches(textFileLogObserver(out), TwistdText(), reactor, most=1000)
    batches.start(reactor)
    log = Logger(namespace="crossbar.test", observer=batches)
    for n in range(20):
        log.info("{request}", request=f"lab gpu-a GET /{n:02} 200 1ms " + "x" * 40, access=())
    assert len(out.writes) == 2 and all(len(batch) >= 1000 for batch in out.writes)
    reactor.advance(0.1)
    assert "".join(out.writes).count("\n") == 20


def test_the_json_lines_are_unchanged_and_batched_too() -> None:
    before = io.StringIO()
    stock = as_json(FileLogObserver(before, str))
    reactor, out, log = _running("json")
    for event in _events():
        stock(event)
        log.observer(event)
    reactor.advance(0.1)
    assert "".join(out.writes) == before.getvalue()
    assert len(out.writes) == 3  # the warning and the failure went at once, the rest after


def test_syslog_s_observer_is_left_as_twistd_made_it() -> None:
    seen: list[dict[str, object]] = []
    syslog = seen.append
    assert writer(syslog, "text", MemoryReactorClock()) is syslog
    as_words = writer(syslog, "json", MemoryReactorClock())
    as_words({"log_format": "x", "log_time": 0.0, "host_state": "up", "name": "gpu-a"})
    assert '"state":"up"' in seen[0]["log_json"]  # type: ignore[operator]


def test_a_line_from_another_thread_is_written_at_once() -> None:
    reactor, out, log = _running()
    log.info("{request}", request="lab gpu-a GET / 200 1ms", access=())
    worker = threading.Thread(target=log.warn, args=("from a thread",))
    worker.start()
    worker.join()
    [alone] = out.writes  # the reactor's batch still waits for its timer
    assert alone.endswith("[crossbar.test#warn] from a thread\n")
    reactor.advance(0.1)
    assert out.writes[1].endswith("lab gpu-a GET / 200 1ms\n")


def test_the_json_time_is_what_datetime_writes() -> None:
    """The second's text is kept from line to line; the milliseconds, rounding included,
    are what ``datetime`` makes of the same time."""
    from datetime import UTC, datetime

    from crossbar.logformat import _time

    rng = random.Random(7)
    base = 1_764_600_000
    edges = (0.0, 0.0004995, 0.0005, 0.4999999, 0.9994999, 0.9995, 0.9999994, 0.9999996)
    times = [base + rng.random() * 86_400 for _ in range(20_000)]
    times += [float(base + s) + e for s in range(3) for e in edges]
    times += [0, 1, base, -1.25]
    for when in times:
        expected = datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")
        assert _time(when) == expected, when
    assert _time(None) is None and _time("x") is None


@given(
    st.text(max_size=30),
    st.text(max_size=60),
    st.one_of(st.none(), st.integers(min_value=0, max_value=10**12)),
)
@example(model="mod\u00e8le", message="", sent=None)
@example(model="", message="\x7f", sent=None)  # DEL: msgspec leaves it, json escapes it
@settings(max_examples=300, deadline=None)
def test_a_json_line_is_what_the_json_module_writes_and_ascii(
    model: str, message: str, sent: int | None
) -> None:
    """Whatever a client names its model or a message says: one line of ASCII, the very
    text ``json.dumps`` writes (control characters and DEL escaped)."""
    access = RequestRecord(
        "lab", "gpu-a", 200, 0.5, None, sent or 0, model, method=b"POST",
        path=b"/lab/v1/chat/completions", asked_model=model or None,
    )  # fmt: skip
    for event in (
        {"access": access, "access_model": model, "log_level": LogLevel.info, "log_time": 1.0},
        {
            "log_format": "said: {m}",
            "m": message,
            "log_level": LogLevel.warn,
            "log_time": 2.0,
            "log_namespace": "crossbar",
        },
    ):
        line = json_line(event)
        assert line is not None and line.isascii() and line.endswith("\n")
        assert line.count("\n") == 1
        expected = json.dumps(json.loads(line), separators=(",", ":"))
        assert line[:-1] == expected


def test_a_refusal_s_json_line_says_why() -> None:
    out = io.StringIO()
    log = Logger(namespace="crossbar.test", observer=as_json(FileLogObserver(out, str)))
    access = refused_record(401, b"GET", b"/lab/v1/models", "unauthorized: key not known")
    log.info("{request}", request="the text line", access=access)
    line = json.loads(out.getvalue())
    assert (line["status"], line["note"]) == (401, "unauthorized: key not known")


def test_a_json_line_names_the_model_served_and_the_alias_sent() -> None:
    access = RequestRecord("lab", "gpu-a", 200, 0.5, model="qwen", asked_model="claude-x")
    plain = attrs.evolve(access, asked_model=None)
    lines = [
        json.loads(json_line({"access": record, "access_model": "qwen", "log_time": 1.0}) or "")
        for record in (access, plain)
    ]
    assert [(line["model"], line["asked_model"]) for line in lines] == [
        ("qwen", "claude-x"),
        ("qwen", None),
    ]

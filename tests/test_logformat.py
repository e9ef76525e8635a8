"""``log_format: json``: crossbar's own lines as one JSON object each, through twistd's
log options."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from twisted.logger import FileLogObserver, Logger, formatEventAsClassicLogText

from crossbar.config import ConfigError, parse_config
from crossbar.logformat import as_json
from tests.support import free_port, start_daemon


def test_a_twistd_log_file_gets_one_json_object_per_line(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path,
        "log_format: json\n"
        f"hosts:\n  gpu-a: http://127.0.0.1:{free_port()}\n"  # nobody there: the host is down
        "routes:\n  lab:\n    hosts: [gpu-a]\n    api_keys: [route-key-77]\n",
        twistd_args=["--logfile=x.log"],
    )
    port = daemon.port
    try:
        body = b'{"model": "qwen-7b", "messages": [{"role": "user", "content": "secret-body-55"}]}'
        asked = urllib.request.Request(
            f"{daemon.url}/lab/v1/chat/completions",
            data=body,
            headers={"Authorization": "Bearer route-key-77", "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(asked, timeout=5).close()
        except urllib.error.HTTPError as e:
            assert e.code == 503
    finally:
        code = daemon.stop()
    assert code == 0, daemon.output()
    text = (tmp_path / "x.log").read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one object
    assert all(isinstance(line, dict) and line["time"] for line in lines)
    [request] = [line for line in lines if line["event"] == "request"]
    assert request | {"time": None, "ms": 0, "ttfb_ms": None} == {
        "time": None,
        "level": "info",
        "event": "request",
        "route": "lab",
        "host": None,
        "model": "qwen-7b",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 503,
        "ms": 0,
        "ttfb_ms": None,
        "bytes": 0,
        "note": None,
    }
    [host] = [line for line in lines if line["event"] == "host"]
    assert (host["host"], host["state"], host["level"]) == ("gpu-a", "down", "warn")
    assert host["reason"]
    said = [line["text"] for line in lines if line["event"] == "message"]
    assert any(f"route lab: http://127.0.0.1:{port}/lab/v1" in words for words in said)
    assert any("stopping: no request in flight" in words for words in said)
    assert "route-key-77" not in text and "secret-body-55" not in text


def test_the_request_line_names_what_went_unusually() -> None:
    out = io.StringIO()
    log = Logger(namespace="crossbar.test", observer=as_json(FileLogObserver(out, str)))
    access = ("lab", "gpu-b", None, b"POST", b"/v1/x\x00", 200, 0.8404, 0.0123, 512,
              " (client left) (tried gpu-a, gpu-b)")  # fmt: skip
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

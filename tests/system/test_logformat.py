"""``log_format: json`` under a real ``twistd``: its log file gets one JSON object a line,
the request lines while crossbar runs, and with workers every line is still an object.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

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
    # an unnamed key, by a fingerprint that cannot be turned back into it
    assert re.fullmatch(r"key-[0-9a-f]{8}", request["key"]), request["key"]
    assert request | {"time": None, "ms": 0, "ttfb_ms": None, "key": None} == {
        "time": None,
        "level": "info",
        "event": "request",
        "route": "lab",
        "host": None,
        "model": "(other)",  # no host lists it (the only one is down): as in the metrics
        "asked_model": None,  # no alias mapped it
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 503,
        "ms": 0,
        "ttfb_ms": None,
        "bytes": 0,
        "wait_ms": None,
        "key": None,
        "prompt_tokens": None,
        "cached_tokens": None,
        "completion_tokens": None,
        "ttft_ms": None,
        "tok_s": None,
        "note": "no healthy host for route lab: gpu-a down (health: connection refused)",
    }
    [host] = [line for line in lines if line["event"] == "host"]
    assert (host["host"], host["state"], host["level"]) == ("gpu-a", "down", "warn")
    assert host["reason"]
    said = [line["text"] for line in lines if line["event"] == "message"]
    assert any(f"route lab: http://127.0.0.1:{port}/lab/v1" in words for words in said)
    assert any("stopping: no request in flight" in words for words in said)
    assert "route-key-77" not in text and "secret-body-55" not in text


# -- the text lines: twistd's to the byte, written in batches ----------------------------------


def test_a_twistd_log_file_gets_the_request_lines_while_crossbar_runs(tmp_path: Path) -> None:
    daemon = start_daemon(
        tmp_path,
        f"hosts:\n  gpu-a: http://127.0.0.1:{free_port()}\n"  # nobody there: the host is down
        "routes:\n  lab:\n    hosts: [gpu-a]\n",
        twistd_args=["--logfile=x.log"],
    )
    path = tmp_path / "x.log"
    line = re.compile(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \[crossbar\.access#info\] "
        r"lab - POST /v1/chat/completions 503 \d+ms \(no healthy host for route lab: .*\)$",
        re.MULTILINE,
    )
    try:
        asked = urllib.request.Request(f"{daemon.url}/lab/v1/chat/completions", data=b"{}")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(asked, timeout=5)
        assert daemon.wait(lambda: bool(line.search(path.read_text())), 5), path.read_text()
    finally:
        code = daemon.stop()
    assert code == 0, daemon.output()
    text = path.read_text()
    assert "stopping: no request in flight" in text
    assert text.rstrip().endswith("Server Shut Down.")


def test_with_workers_every_request_line_is_an_object(tmp_path: Path) -> None:
    """Worker 1's lines reach worker 0's log as the JSON objects they are, named."""
    daemon = start_daemon(
        tmp_path,
        "log_format: json\nworkers: 2\n"
        f"hosts:\n  gpu-a: http://127.0.0.1:{free_port()}\n"  # nobody there: 503s
        "routes:\n  lab:\n    hosts: [gpu-a]\n",
        twistd_args=["--logfile=x.log"],
    )
    try:
        assert daemon.wait(lambda: "worker-1" in (tmp_path / "x.log").read_text(), 20)
        for _ in range(40):  # new connections, spread over both workers by the kernel
            try:
                urllib.request.urlopen(f"{daemon.url}/lab/v1/models", timeout=5).close()
            except urllib.error.HTTPError as e:
                assert e.code == 503
    finally:
        assert daemon.stop() == 0, daemon.output()
    lines = [json.loads(line) for line in (tmp_path / "x.log").read_text().splitlines()]
    requests = [line for line in lines if line["event"] == "request"]
    assert len(requests) == 40
    assert all(r["path"] == "/v1/models" and r["status"] == 503 for r in requests)
    by_worker = {r.get("worker") for r in requests}
    assert by_worker == {None, "worker-1"}, by_worker  # worker 0's own, and worker 1's
    assert not [line for line in lines if "lab - GET" in str(line.get("text", ""))]

"""``python -m crossbar.testing.simulator``: the simulated hosts people point a crossbar at."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import Daemon, accepts, free_port


def models(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
        body: dict[str, Any] = json.loads(r.read())
        return body


def run(tmp_path: Path, *options: str) -> Daemon:
    port = free_port()
    args = [sys.executable, "-m", "crossbar.testing.simulator", "--listen", str(port), *options]
    daemon = Daemon.start(args, port, tmp_path / "simulator.log", cwd=tmp_path)
    if not daemon.wait(lambda: accepts(port), 20.0):
        daemon.stop()
        pytest.fail(f"the simulator did not listen:\n{daemon.output()}")
    return daemon


def test_router_hosts_with_their_models(tmp_path: Path) -> None:
    other = free_port()
    daemon = run(tmp_path, "--models", "a=loaded, b", "--host", f"{other}:c=loading")
    try:
        listed = {m["id"]: m["status"]["value"] for m in models(daemon.port)["data"]}
        assert listed == {"a": "loaded", "b": "unloaded"}
        assert [m["id"] for m in models(other)["data"]] == ["c"]
    finally:
        daemon.stop()
    assert f"crossbar simulator (router) listening on {daemon.url}: a=loaded, b" in daemon.output()


def test_single_model_host(tmp_path: Path) -> None:
    daemon = run(tmp_path, "--single", "--models", "solo=loaded", "--chunks", "3")
    try:
        request = urllib.request.Request(f"{daemon.url}/v1/completions", data=b'{"prompt": "x"}')
        with urllib.request.urlopen(request, timeout=5) as r:
            answer = json.loads(r.read())
        assert answer["model"] == "solo"
        assert answer["choices"][0]["text"] == "abc"
        assert "status" not in models(daemon.port)["data"][0]
    finally:
        daemon.stop()
    assert "crossbar simulator (single-model) listening" in daemon.output()

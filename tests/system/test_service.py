"""The daemon as users run it: ``twistd -n crossbar``, started and stopped for real."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

from tests.support import Daemon, demo_route_ready, free_port, start_daemon
from tests.support.errors import api_error

ROUTE = "routes:\n  lab:\n    hosts: [gpu-a]\n"
REFUSED = "no healthy host for route lab: gpu-a down (health: connection refused)"
"""The 503 of a route whose one host refuses connections."""


def request(url: str, headers: dict[str, str] | None = None) -> tuple[int, object]:
    """Status and JSON body of a GET."""
    asked = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(asked, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stop(daemon: Daemon) -> tuple[int, str]:
    """SIGTERM, as a service manager stops it: its exit code and everything it wrote."""
    return daemon.stop(), daemon.output()


def test_serves_from_config_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    dead = free_port()
    daemon = start_daemon(
        tmp_path,
        f"poll_interval: 1h\nhosts:\n  gpu-a: http://127.0.0.1:{dead}\n"
        "routes:\n  lab:\n    hosts: [gpu-a]\n    default_model: m\n",
    )
    port = daemon.port
    try:
        assert request(f"{daemon.url}/lab/v1/models") == (503, api_error(503, REFUSED))
        assert request(f"{daemon.url}/nope/v1/models") == (404, api_error(404, "unknown route"))
    finally:
        code, out = stop(daemon)
    assert code == 0, out
    assert "Cancelled" not in out  # a poll cut short by the stop records nothing
    assert "lab - GET /v1/models 503" in out
    assert "Traceback" not in out
    # It said what it serves, with the base URL an agent needs.
    assert f"crossbar 0.1.0 listening on tcp:{port}:interface=127.0.0.1" in out
    assert f"route lab: http://127.0.0.1:{port}/lab/v1 -> hosts gpu-a;" in out
    assert "simulated" not in out


def test_keys_and_the_pages_own_port_under_twistd(tmp_path: Path) -> None:
    pages = free_port()
    daemon = start_daemon(
        tmp_path,
        f'status_listen: "tcp:{pages}:interface=127.0.0.1"\n'
        'status_keys: ["${CROSSBAR_STATUS_KEY}"]\n'
        "api_keys: [route-key-77]\n"
        "poll_interval: 1h\n"
        f"hosts:\n  gpu-a: http://127.0.0.1:{free_port()}\n{ROUTE}",
        env={"CROSSBAR_STATUS_KEY": "status-key-88"},
    )
    main, own = daemon.url, f"http://127.0.0.1:{pages}"
    try:
        assert request(main + "/lab/v1/models") == (
            401,
            api_error(401, "unauthorized: no key sent"),
        )
        assert request(main + "/lab/v1/models", {"X-Api-Key": "route-key-77"})[0] == 503
        assert request(main + "/_crossbar/status") == (404, {"error": "not found"})
        assert request(main + "/_crossbar/livez") == (200, {"live": True})
        refused = {"error": "unauthorized: the status pages need a key"}
        assert request(own + "/_crossbar/status") == (401, refused)
        code, status = request(own + "/_crossbar/status", {"Authorization": "Bearer status-key-88"})
        assert code == 200 and "gpu-a" in status["hosts"]  # type: ignore[index]
    finally:
        code, out = stop(daemon)
    assert code == 0, out
    assert f"status pages: {own}/_crossbar/ (the main port serves only" in out
    assert "lab - GET /v1/models 503" in out and "- - GET /lab/v1/models 401" in out
    assert out.count(" starting on ") == 1, out  # the pages' port is announced once, above
    assert "route-key-77" not in out and "status-key-88" not in out


def test_a_log_file_given_to_twistd_gets_the_log(tmp_path: Path) -> None:
    """crossbar filters twistd's log but leaves its options alone: --logfile still works."""
    daemon = start_daemon(
        tmp_path,
        f"poll_interval: 1h\nhosts:\n  gpu-a: http://127.0.0.1:{free_port()}\n{ROUTE}",
        twistd_args=["--logfile=twistd.log"],
    )
    try:
        request(f"{daemon.url}/lab/v1/models")
    finally:
        code, out = stop(daemon)
    assert code == 0, out
    log = (tmp_path / "twistd.log").read_text()
    assert f"route lab: {daemon.url}/lab/v1" in log
    assert "lab - GET /v1/models 503" in log
    assert "lab - GET" not in out


def test_listen_on_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        daemon = start_daemon(
            tmp_path,
            f'listen: "tcp:{busy}:interface=127.0.0.1"\npoll_interval: 1h\n'
            f"hosts:\n  gpu-a: http://127.0.0.1:{free_port()}\n{ROUTE}",
            port=port,
            args=["--listen", f"tcp:{port}:interface=127.0.0.1"],
        )
        try:
            assert request(f"{daemon.url}/lab/v1/models") == (
                503,
                api_error(503, REFUSED),
            )
        finally:
            code, out = stop(daemon)
    assert code == 0, out


def test_demo_fleet_routes_by_model(tmp_path: Path) -> None:
    # Ready once the first polls of the simulated hosts are in.
    daemon = start_daemon(tmp_path, None, args=["--demo"], ready=demo_route_ready)
    port = daemon.port
    try:
        asked = urllib.request.Request(
            f"{daemon.url}/opencode/v1/chat/completions",
            data=b'{"model": "gpt-oss-20b", "messages": [], "max_tokens": 2}',
        )
        with urllib.request.urlopen(asked, timeout=10) as r:
            assert r.headers["X-Crossbar-Host"] == "gpu-b"
            assert json.loads(r.read())["model"] == "gpt-oss-20b"
    finally:
        code, out = stop(daemon)
    assert code == 0, out
    assert "the fleet is simulated (--demo)" in out
    # Only the port agents use is announced; the simulated hosts' ports are crossbar's own.
    assert out.count(" starting on ") == 1, out
    assert f"crossbar starting on {port}" in out
    assert f"route opencode: http://127.0.0.1:{port}/opencode/v1 -> hosts gpu-a, gpu-b;" in out


def test_port_in_use_stops_startup(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        listen = f"tcp:{taken}:interface=127.0.0.1"
        daemon = start_daemon(
            tmp_path, None, port=taken, args=["--demo", "--listen", listen], wait=False
        )
        try:
            code = daemon.proc.wait(timeout=30)
        finally:
            daemon.stop()
    out = daemon.output()
    assert code != 0
    line = f"crossbar: cannot listen on {listen}: address already in use"
    assert out.strip().splitlines()[-1] == line, out
    assert "Traceback" not in out

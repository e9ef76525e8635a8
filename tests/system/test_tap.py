"""``twistd crossbar --check``, run for real: the effective config and exit 0, or the one
error line and exit 2, and nothing started either way."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import TWISTD
from tests.support.twistdenv import ENV


def check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``twistd crossbar --check`` in ``tmp_path`` with twistd's default pid file, as an
    admin would type it."""
    return run(tmp_path, "crossbar", *args, "--check")


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TWISTD, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=ENV
    )


def test_a_good_config_is_printed_and_nothing_starts(tmp_path: Path) -> None:
    """The port crossbar would listen on is taken and is also the host's: a check that
    bound it would fail, one that polled the host would connect to it."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(8)
    port = taken.getsockname()[1]
    path = tmp_path / "crossbar.yaml"
    path.write_text(
        f'listen: "tcp:{port}:interface=127.0.0.1"\napi_keys: ["${{LAB_KEY}}"]\n'
        f"hosts: {{gpu-a: 'http://127.0.0.1:{port}'}}\nroutes: {{r: {{hosts: [gpu-a]}}}}\n"
    )
    with taken:
        result = check(tmp_path, "--config", str(path))
        assert result.returncode == 0, result.stderr
        taken.setblocking(False)
        try:
            taken.accept()[0].close()
            polled = True
        except BlockingIOError:
            polled = False
    assert not polled
    assert result.stderr == ""
    shown = yaml.safe_load(result.stdout)
    assert shown["listen"] == f"tcp:{port}:interface=127.0.0.1:backlog=1024"
    assert shown["hosts"]["gpu-a"]["poll_interval"] == 5.0
    assert shown["routes"]["r"]["api_keys"] == ["${LAB_KEY} (****)"]
    assert "lab-secret-9" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crossbar.yaml"]  # no twistd.pid, log


def test_a_bad_config_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "crossbar.yaml"
    path.write_text("hosts: {gpu-a: 'http://h'}\nroutes: {r: {hosts: [gpu-x]}}\n")
    result = check(tmp_path, "--config", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"crossbar: {path}: routes.r.hosts: item 0: unknown host 'gpu-x'\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crossbar.yaml"]


def test_the_demo_config_is_checked_without_its_simulated_hosts(tmp_path: Path) -> None:
    result = check(tmp_path, "--demo", "--listen", "7788")
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["listen"] == "tcp:7788:backlog=1024"
    assert set(shown["routes"]) == {"opencode", "hermes"}
    assert shown["hosts"]["gpu-a"]["url"] == "http://127.0.0.1"  # none listening: no port
    assert sorted(p.name for p in tmp_path.iterdir()) == []


START = ("-n", "--pidfile=", "crossbar", "--config", "crossbar.yaml")
CHECK = ("crossbar", "--config", "crossbar.yaml", "--check")


@pytest.mark.parametrize("args", [START, CHECK], ids=["start", "check"])
def test_a_yaml_error_on_the_last_line_is_one_line_and_exit_code_2(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Audit finding 8: this was an IndexError's traceback and exit code 1, which systemd's
    ``Restart=on-failure`` answers with a start every 2 s."""
    (tmp_path / "crossbar.yaml").write_text("hosts: {gpu-a: 'http://h'}\nroutes: [oops\n")
    result = run(tmp_path, *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "crossbar: crossbar.yaml: YAML syntax error: at the end of the file: expected ',' or "
        "']', but got '<stream end>' (while parsing a flow sequence begun on line 2)\n"
    )


@pytest.mark.parametrize("args", [START, CHECK], ids=["start", "check"])
def test_a_url_password_never_reaches_the_error_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Audit finding 10: a password holding ``/``, ``?``, ``#`` or ``@`` was quoted whole,
    twice (urllib's own message repeated its first part). Each one alone: test_config."""
    (tmp_path / "crossbar.yaml").write_text(
        "hosts: {gpu-a: {url: 'https://admin:hun/ter?2#x@y@gpu-a.lab:8443'}}\n"
        "routes: {r: {hosts: [gpu-a]}}\n"
    )
    result = run(tmp_path, *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "crossbar: crossbar.yaml: hosts.gpu-a.url: must not carry credentials (give the host "
        "an api_key): 'https://admin:****@gpu-a.lab:8443'\n"
    )


def test_version_prints_crossbar_s_own(tmp_path: Path) -> None:
    from crossbar import __version__

    result = run(tmp_path, "crossbar", "--version")
    assert (result.returncode, result.stdout) == (0, f"crossbar {__version__}\n")

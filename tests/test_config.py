"""crossbar.yaml checks: the minimal form works, and every mistake names file, key and problem."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from crossbar.config import ConfigError, HostSettings, load_config, parse_config, parse_duration

MINIMAL = """\
listen: 7777                # a port, or a Twisted server endpoint string
poll_interval: 5s
hosts:
  gpu-a: http://10.0.0.11:8080
  gpu-b: http://10.0.0.12:8080/
routes:
  opencode-a:
    hosts: [gpu-a, gpu-b]
    default_model: qwen3-coder-30b
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "crossbar.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    return message[len(str(path)) + 2 :]


def test_minimal_form_is_accepted(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.listen == "tcp:7777:backlog=1024"  # all interfaces, room for bursts
    assert config.defaults.poll_interval == 5.0
    assert config.settings["gpu-a"] == HostSettings()  # every default as documented
    assert config.hosts["gpu-a"].url == "http://10.0.0.11:8080"
    assert config.hosts["gpu-b"].url == "http://10.0.0.12:8080"  # trailing slash trimmed
    route = config.routes["opencode-a"]
    assert route.hosts == ("gpu-a", "gpu-b")
    assert route.default_model == "qwen3-coder-30b"


def test_example_config_in_repo_is_valid() -> None:
    example = Path(__file__).parent.parent / "crossbar.yaml"
    config = load_config(example)
    assert config.hosts["gpu-c"].url == "http://10.0.0.13:8080/llama"  # path prefix kept
    assert {r.list_models for r in config.routes.values()} == {"merged"}
    minimal = parse_config(yaml.safe_load(MINIMAL))
    assert {r.list_models for r in minimal.routes.values()} == {"forwarded"}  # the default


def test_endpoint_string_listen(tmp_path: Path) -> None:
    text = MINIMAL.replace("listen: 7777 ", 'listen: "tcp:7777:interface=127.0.0.1"')
    listen = load_config(write(tmp_path, text)).listen
    assert listen == "tcp:7777:interface=127.0.0.1:backlog=1024"  # Twisted's 50 drops bursts


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5.0), ("2m", 120.0), ("1h", 3600.0), (3, 3.0), (0.5, 0.5)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file"):
        load_config(path)


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "listen: 7777\nhosts: [a, b\nroutes: {}\n")
    assert message.startswith("YAML syntax error: line ")


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        (("poll_interval: 5s", "poll_interval: 5s\nretries: 3"), "retries", "unknown key"),
        (
            ("    default_model", "    colour: red\n    default_model"),
            "routes.opencode-a.colour",
            "unknown key",
        ),
        (("[gpu-a, gpu-b]", "[gpu-a, gpu-z]"), "routes.opencode-a.hosts", "unknown host 'gpu-z'"),
        (("[gpu-a, gpu-b]", "[]"), "routes.opencode-a.hosts", "non-empty list"),
        (("http://10.0.0.11:8080", "ftp://10.0.0.11"), "hosts.gpu-a", "http(s)://"),
        (("http://10.0.0.11:8080", "http://10.0.0.11:8080/x?y=1"), "hosts.gpu-a", "no query"),
        (
            ("http://10.0.0.11:8080", "http://10.0.0.11:8080/#top"),
            "hosts.gpu-a",
            "no query or fragment",
        ),
        (("http://10.0.0.11:8080", "http://10.0.0.11:99999"), "hosts.gpu-a", "valid URL"),
        (("http://10.0.0.11:8080", "10.0.0.11:8080"), "hosts.gpu-a", "http(s)://"),
        (("poll_interval: 5s", "poll_interval: 5 parsecs"), "poll_interval", "not a duration"),
        (("poll_interval: 5s", "poll_interval: 0s"), "poll_interval", "more than zero"),
        (("poll_interval: 5s", "poll_interval: -2"), "poll_interval", "more than zero"),
        (("listen: 7777 ", "listen: 70000 "), "listen", "1-65535"),
        (("listen: 7777 ", "listen: 0 "), "listen", "1-65535"),
        (("listen: 7777 ", 'listen: "bogus:thing" '), "listen", "unknown endpoint type"),
        (("listen: 7777 ", 'listen: "tcp:7777:colour=red" '), "listen", "unknown option 'colour'"),
        (("listen: 7777 ", 'listen: "tcp:seven" '), "listen", "a port must be a number"),
        (("  gpu-b: http", "  gpu-a: http"), "hosts.gpu-a", "duplicate key"),
        (
            ("poll_interval: 5s", "poll_interval: 5s\npoll_interval: 9s"),
            "poll_interval",
            "duplicate",
        ),
        (
            (
                "    default_model",
                "    policy: priority\n    policy: least_busy\n    default_model",
            ),
            "routes.opencode-a.policy",
            "duplicate key",
        ),
        (("  gpu-b: http", "  gpu b: http"), "hosts.gpu b", "must match [A-Za-z0-9._-]+"),
        (("  opencode-a:", "  open/code:"), "routes.open/code", "must match [A-Za-z0-9._-]+"),
        (("  opencode-a:", "  _crossbar:"), "routes._crossbar", "reserved"),
        (
            ("    default_model", "    policy: fastest\n    default_model"),
            "routes.opencode-a.policy",
            "must be one of priority, round_robin, least_busy",
        ),
        (
            ("    default_model", "    when_all_down: panic\n    default_model"),
            "routes.opencode-a.when_all_down",
            "must be one of fail, try_all",
        ),
        (
            ("    default_model", "    list_models: all\n    default_model"),
            "routes.opencode-a.list_models",
            "must be one of forwarded, merged",
        ),
        (("poll_interval: 5s", "poll_interval: 5s\nmax_fails: 0"), "max_fails", "at least 1"),
        (
            ("poll_interval: 5s", "poll_interval: 5s\nhealth_path: /slots"),
            "health_path",
            "load a model",
        ),
    ],
)
def test_mistakes_name_key_and_problem(
    tmp_path: Path, change: tuple[str, str], key: str, problem: str
) -> None:
    old, new = change
    assert old in MINIMAL
    message = error_of(tmp_path, MINIMAL.replace(old, new, 1))
    assert message.startswith(f"{key}: "), message
    assert problem in message


def test_missing_sections(tmp_path: Path) -> None:
    assert error_of(tmp_path, "listen: 7777\n").startswith("hosts: is missing")
    assert error_of(tmp_path, "") == "is empty"


def test_bad_config_stops_twistd_with_one_line(tmp_path: Path) -> None:
    """The user-facing contract: non-zero exit, last line names file, key, problem; no traceback."""
    path = write(tmp_path, MINIMAL.replace("[gpu-a, gpu-b]", "[gpu-a, gpu-x]"))
    twistd = Path(sys.executable).with_name("twistd")
    result = subprocess.run(
        [str(twistd), "-n", "--pidfile=", "crossbar", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert "Traceback" not in output
    assert output.splitlines()[-1] == (
        f"crossbar: {path}: routes.opencode-a.hosts: item 1: unknown host 'gpu-x'"
    )

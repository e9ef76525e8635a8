"""crossbar.clients: each agent's settings for a route, with the smallest slot window its
hosts told crossbar, read from a running crossbar's ``/_crossbar/status``."""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from crossbar.clients import render, route_windows
from crossbar.clients.__main__ import main
from crossbar.clients.settings import NoWindow

STATUS: dict[str, Any] = {
    "hosts": {
        "gpu-a": {"windows": {"qwen3-coder-30b": 32768}},
        "gpu-b": {"windows": {"qwen3-coder-30b": 131072, "gpt-oss-20b": 65536}},
        "gpu-c": {"windows": {"qwen3-coder-30b": 4096}},  # not on the route
    },
    "routes": {
        "opencode": {
            "base_url": "http://crossbar:7777/opencode/v1",
            "hosts": ["gpu-a", "gpu-b"],
            "default_model": "qwen3-coder-30b",
        },
        "bare": {"base_url": "http://crossbar:7777/bare/v1", "hosts": ["gpu-a"]},
    },
}


def test_the_smallest_window_of_the_route_s_hosts_is_the_model_s() -> None:
    found = route_windows(STATUS, "opencode")
    assert (found.model, found.window, found.output) == ("qwen3-coder-30b", 32768, 8192)
    assert route_windows(STATUS, "opencode", "gpt-oss-20b").window == 65536


@pytest.mark.parametrize(
    ("route", "model", "words"),
    [
        ("nope", None, "no route 'nope'"),
        ("bare", None, "no default model"),
        ("opencode", "hermes", "has told its window for 'hermes'"),
    ],
)
def test_what_is_unknown_is_said_in_words(route: str, model: str | None, words: str) -> None:
    with pytest.raises(NoWindow, match=words):
        route_windows(STATUS, route, model)


def test_claude_code_gets_its_environment_with_the_window_and_no_key() -> None:
    text = render("claude", route_windows(STATUS, "opencode"))
    lines = text.splitlines()
    assert "export ANTHROPIC_BASE_URL=http://crossbar:7777/opencode" in lines
    assert 'export ANTHROPIC_AUTH_TOKEN="${CROSSBAR_KEY:-unused}"' in lines
    assert "export CLAUDE_CODE_AUTO_COMPACT_WINDOW=32768" in lines
    assert "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=32768" in lines
    assert "export CLAUDE_CODE_MAX_OUTPUT_TOKENS=8192" in lines


def test_codex_gets_a_config_toml_with_its_window_and_compaction_limit() -> None:
    doc = tomllib.loads(render("codex", route_windows(STATUS, "opencode"), "LAB_KEY"))
    assert doc["model"] == "qwen3-coder-30b" and doc["model_provider"] == "crossbar"
    assert (doc["model_context_window"], doc["model_auto_compact_token_limit"]) == (32768, 26214)
    provider = doc["model_providers"]["crossbar"]
    assert provider["base_url"] == "http://crossbar:7777/opencode/v1"
    assert (provider["wire_api"], provider["env_key"]) == ("responses", "LAB_KEY")


def test_opencode_gets_an_opencode_json_with_each_model_s_limits() -> None:
    doc = json.loads(render("opencode", route_windows(STATUS, "opencode")))
    provider = doc["provider"]["opencode"]
    assert provider["options"] == {
        "baseURL": "http://crossbar:7777/opencode/v1",
        "apiKey": "{env:CROSSBAR_KEY}",
    }
    assert provider["models"]["qwen3-coder-30b"] == {"limit": {"context": 32768, "output": 8192}}
    assert provider["models"]["gpt-oss-20b"]["limit"]["context"] == 65536
    assert doc["model"] == "opencode/qwen3-coder-30b"


class _Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        wanted = self.headers.get("Authorization") == "Bearer s3cret"
        code, body = (200, json.dumps(STATUS).encode()) if wanted else (401, b"{}")
        self.send_response(code if self.path == "/_crossbar/status" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def crossbar_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_command_reads_a_running_crossbar_s_status(
    crossbar_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATUS_KEY", "s3cret")
    args = ["--url", crossbar_url, "--route", "opencode", "--agent", "codex"]
    main([*args, "--status-key-env", "STATUS_KEY"])
    assert "model_context_window = 32768" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="answered 401 for its status"):
        main(args)
    with pytest.raises(SystemExit, match="no route 'lab'"):
        main(
            [
                "--url",
                crossbar_url,
                "--route",
                "lab",
                "--agent",
                "claude",
                "--status-key-env",
                "STATUS_KEY",
            ]
        )

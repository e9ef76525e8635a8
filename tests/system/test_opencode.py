"""A real coding agent through crossbar: OpenCode's ``opencode run`` against ``--demo``.

OpenCode is installed from npm at a pinned version, once, into a cache outside the
repository (as ``scripts/llama-server.sh`` caches its binary; see
:func:`tests.support.npm.install_npm_package`)::

    ${LLAMA_CROSSBAR_CACHE:-$HOME/.cache/llama-crossbar}/opencode-<version>/

When npm cannot install it (no npm, no registry, a failed install) the test is skipped with
the reason; set ``CROSSBAR_REQUIRE_OPENCODE`` to a non-empty value to make that a failure
instead.

OpenCode then runs with a private HOME (and XDG dirs) under the test's folder and an
environment of its own (none of the user's variables or keys), its update check, models
fetch, sharing, LSP downloads and default plugins turned off, and every address but
127.0.0.1 unreachable: proxies and npm's registry point at a closed loopback port. The
OpenAI-compatible provider (``@ai-sdk/openai-compatible``) is bundled in the pinned
version, so nothing is installed at run time; the plugin package it would fetch into its
config folder fails to install, which it ignores.

About 5 to 10 s once the cache is filled; the first install adds the download of the
npm packages (about 120 MB, 355 MB unpacked).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Daemon, demo_route_ready, start_daemon
from tests.support.npm import install_npm_package, sandbox_env

OPENCODE_VERSION = "1.18.33"
"""The pinned ``opencode-ai`` on npm (its platform binary comes as an optional dependency,
``opencode-linux-x64``, linked into place by the package's postinstall)."""

MODEL = "qwen3-coder-30b"
"""The demo's default model of route ``opencode``, loaded on gpu-a."""

# Bounds of every wait here.
INSTALL_TIMEOUT = 600.0
VERSION_TIMEOUT = 30.0
CROSSBAR_TIMEOUT = 30.0
RUN_TIMEOUT = 120.0
LOG_TIMEOUT = 10.0

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def opencode_json(base_url: str) -> dict[str, object]:
    """The project's ``opencode.json``: the README's, with crossbar's address."""
    return {
        "provider": {
            "lab": {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": base_url},
                "models": {MODEL: {}},
            }
        }
    }


def _tail(text: str | bytes | None, lines: int = 30) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:]) or "(nothing)"


def opencode_env(home: Path) -> dict[str, str]:
    """An environment of OpenCode's own: private dirs, no network but 127.0.0.1."""
    return {
        **sandbox_env(home),
        # OpenCode's own switches for what it would fetch, share or read.
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
        "OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
    }


# -- the install, cached ----------------------------------------------------------------------


def _binary(prefix: Path) -> Path:
    return prefix / "node_modules" / ".bin" / "opencode"


def _runs(binary: Path) -> bool:
    """Whether ``binary`` is the pinned OpenCode and runs (asked with a throwaway HOME,
    since even ``--version`` makes OpenCode's folders)."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    with tempfile.TemporaryDirectory(prefix="opencode-version-") as home:
        try:
            done = subprocess.run(
                [str(binary), "--version"],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                env=opencode_env(Path(home)),
                timeout=VERSION_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0 and done.stdout.decode(errors="replace").strip() == OPENCODE_VERSION


def install_opencode() -> Path:
    """The pinned OpenCode's binary, installed into the cache first if need be."""
    prefix = install_npm_package(
        "opencode-ai",
        OPENCODE_VERSION,
        lambda prefix: _runs(_binary(prefix)),
        entry="opencode",
        title="OpenCode",
        install_timeout=INSTALL_TIMEOUT,
        allow_scripts=True,
    )
    return _binary(prefix)


@pytest.fixture(scope="module")
def opencode() -> Path:
    return install_opencode()


# -- crossbar ---------------------------------------------------------------------------------


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Daemon]:
    """``twistd -n crossbar --demo`` on a free loopback port, its route ready."""
    folder = tmp_path / "crossbar"
    folder.mkdir()
    daemon = start_daemon(
        folder, None, args=["--demo"], timeout=CROSSBAR_TIMEOUT, ready=demo_route_ready
    )
    try:
        yield daemon
    finally:
        daemon.stop()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# -- the test ---------------------------------------------------------------------------------


def test_opencode_answers_through_crossbar(opencode: Path, demo: Daemon, tmp_path: Path) -> None:
    base_url = f"{demo.url}/opencode/v1"
    project = tmp_path / "project"
    project.mkdir()
    (project / "opencode.json").write_text(json.dumps(opencode_json(base_url), indent=2) + "\n")

    proc = subprocess.Popen(
        [str(opencode), "run", "--print-logs", "--model", f"lab/{MODEL}", "say hi"],
        cwd=project,
        env=opencode_env(tmp_path / "home"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that whatever it starts is ended with it
    )
    try:
        out_bytes, err_bytes = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out_bytes, err_bytes = proc.communicate()
        pytest.fail(
            f"opencode run did not end within {RUN_TIMEOUT:.0f} s\n"
            f"stdout:\n{_tail(out_bytes)}\nstderr:\n{_tail(err_bytes)}\n"
            f"crossbar:\n{demo.log()}"
        )
    finally:
        _kill(proc)
    out = ANSI.sub("", out_bytes.decode(errors="replace"))
    err = ANSI.sub("", err_bytes.decode(errors="replace"))
    report = f"stdout:\n{_tail(out)}\nstderr:\n{_tail(err)}\ncrossbar:\n{demo.log()}"
    assert proc.returncode == 0, f"opencode run exited {proc.returncode}\n{report}"

    # The simulated hosts' answer is the alphabet from "a", 8 to 60 letters.
    words = re.findall(r"[a-z]{8,}", out)
    alphabet = "abcdefghijklmnopqrstuvwxyz" * 3
    assert any(alphabet.startswith(w) for w in words), f"no simulated answer printed\n{report}"

    # crossbar logged OpenCode's requests (its answer, and a title for the session).
    line = re.compile(r"opencode gpu-a POST /v1/chat/completions 200 \d+ms")
    logged = demo.wait(lambda: bool(line.findall(demo.output())), LOG_TIMEOUT)
    assert logged, f"OpenCode's requests are not in crossbar's log\n{report}"
    by_opencode = len(line.findall(demo.output()))

    # The same request, asked by hand, shows the host crossbar chose.
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "say hi"}], "max_tokens": 8}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["X-Crossbar-Host"] == "gpu-a"
        answer = json.loads(response.read())
    assert answer["choices"][0]["message"]["content"] == "abcdefgh"

    assert demo.stop() == 0, demo.log()
    log = demo.output()
    assert len(line.findall(log)) >= by_opencode + 1, log  # ours too
    assert "Traceback" not in log, log

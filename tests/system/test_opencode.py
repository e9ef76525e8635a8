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

Asked to create ``hello.py``, OpenCode creates it with its ``write`` tool: the demo answers
with the tool call, then ends the turn.

On crossbar's own errors OpenCode prints crossbar's words (:data:`PRINTED`); a 5xx only
after it has tried five more times, about 80 s, which it cannot be told not to.

About 5 to 10 s a run once the cache is filled; the first install adds the download of the
npm packages (about 120 MB, 355 MB unpacked).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import REPO, Daemon, demo_route_ready, start_daemon
from tests.support.agents import CREATE, CREATED, Run, run_agent
from tests.support.opencode import MODEL, install_opencode, opencode_env, opencode_json

# Bounds of every wait here.
CROSSBAR_TIMEOUT = 30.0
RUN_TIMEOUT = 120.0
LOG_TIMEOUT = 10.0
RETRIED_TIMEOUT = 300.0
"""A run on a 5xx: OpenCode's five retries (2, 4, 8, 16 and 30 s) and its start, on a
loaded machine."""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _tail(text: str | bytes | None, lines: int = 30) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:]) or "(nothing)"


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


def test_opencode_creates_hello_py_through_crossbar(
    opencode: Path, demo: Daemon, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    settings = opencode_json(f"{demo.url}/opencode/v1")
    (project / "opencode.json").write_text(json.dumps(settings, indent=2) + "\n")
    argv = [str(opencode), "run", "--model", f"lab/{MODEL}", CREATE]
    run = run_agent(argv, project, opencode_env(tmp_path / "home"), RUN_TIMEOUT)
    report = f"{run.report()}\ncrossbar:\n{demo.log()}"
    assert run.code == 0, report
    hello = project / "hello.py"
    assert hello.is_file() and hello.read_text() == CREATED, report
    assert "Created hello.py." in run.out, report


# -- crossbar's own errors, as OpenCode prints them ------------------------------------------

PRINTED = {
    "401": "Error: unauthorized: key not known",
    "404": "Error: unknown route",
    "413": "Error: body too large",
    "503": "Error: no healthy host for route ",
}
"""What OpenCode prints on crossbar's own errors, as docs/clients.md lists it: ``Error: ``
and crossbar's words (``error.message`` of llama-server's shape)."""


def test_opencode_prints_crossbar_s_words(
    opencode: Path, refusing: dict[str, str], tmp_path: Path
) -> None:
    """OpenCode exits 1 on each of crossbar's own errors and prints what :data:`PRINTED`
    says (also in the test's output, ``pytest -rP``). The runs go at once: the 503's
    retries take OpenCode about 80 s."""

    def run(status: str) -> Run:
        base, key = refusing[status].split()
        project = tmp_path / status / "project"
        project.mkdir(parents=True)
        settings = opencode_json(f"{base}/v1", key)
        (project / "opencode.json").write_text(json.dumps(settings, indent=2) + "\n")
        argv = [str(opencode), "run", "--model", f"lab/{MODEL}", "say hi"]
        return run_agent(argv, project, opencode_env(tmp_path / status / "home"), RETRIED_TIMEOUT)

    with ThreadPoolExecutor(len(PRINTED)) as pool:
        runs = dict(zip(PRINTED, pool.map(run, PRINTED), strict=True))
    for status, done in runs.items():
        lines = [line for line in (done.out + done.err).splitlines() if line.strip()]
        print(f"opencode on crossbar's {status}: exit {done.code}")
        print("\n".join(dict.fromkeys(line for line in lines if line.startswith("Error: "))))
    for status, done in runs.items():
        assert done.code == 1, f"{status}: {done.report()}"
        lines = (done.out + done.err).splitlines()
        expected = PRINTED[status]
        assert any(line.startswith(expected) for line in lines), (
            f"{status}: expected {expected!r}\n{done.report()}"
        )


def test_docs_list_what_opencode_prints_on_crossbar_s_errors() -> None:
    """docs/clients.md's table of crossbar's errors has OpenCode's words, as run above."""
    text = (REPO / "docs" / "clients.md").read_text()
    section = text.split("\n## When crossbar refuses a request\n", 1)[1].split("\n## ", 1)[0]
    for status, words in PRINTED.items():
        assert words in section, f"docs/clients.md lacks OpenCode's {status}: {words}"

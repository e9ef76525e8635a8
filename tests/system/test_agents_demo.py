"""An agent at work against ``crossbar --demo``: Claude Code, Codex and OpenCode, each asked
to create ``hello.py``, create it.

The demo's simulated hosts answer a request that offers a tool that writes a file or runs a
command, and asks for a file, with the call that writes it; after the tool's result they end
the turn in a few words ("Created hello.py."). Each agent runs headless, as a person tries it:
Claude Code with ``--permission-mode acceptEdits`` (its Write tool), Codex with
``--dangerously-bypass-approvals-and-sandbox`` (its ``exec_command`` runs the demo's
``echo``; its own sandbox needs user namespaces that containers and CI runners may refuse),
OpenCode's ``run`` (its ``write`` tool, allowed by default). Each is sandboxed as in
:mod:`tests.support.agents`, and installed once into the cache (skipped when npm cannot).
About 5 to 10 s an agent once the cache is filled.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Daemon, demo_route_ready, start_daemon
from tests.support.agents import Run, claude, codex, install_claude, install_codex, run_agent
from tests.support.opencode import MODEL, install_opencode, opencode_env, opencode_json

CROSSBAR_TIMEOUT = 30.0
RUN_TIMEOUT = 60.0
PROMPT = "create hello.py that prints hello"
HELLO = 'print("hello")\n'


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """``twistd -n crossbar --demo`` on a free loopback port, its route ready."""
    folder = tmp_path_factory.mktemp("crossbar")
    daemon = start_daemon(
        folder, None, args=["--demo"], timeout=CROSSBAR_TIMEOUT, ready=demo_route_ready
    )
    try:
        yield daemon
    finally:
        daemon.stop()


def assert_created(run: Run, project: Path, demo: Daemon) -> None:
    """The agent ended well, said the demo's last words, and ``hello.py`` holds its line."""
    report = f"{run.report()}\ncrossbar:\n{demo.log()}"
    assert run.code == 0, report
    hello = project / "hello.py"
    assert hello.is_file(), f"no hello.py in {sorted(p.name for p in project.iterdir())}\n{report}"
    assert hello.read_text() == HELLO, report
    assert "Created hello.py." in run.out, report
    assert "Traceback" not in demo.output(), report


def test_claude_code_creates_hello_py(demo: Daemon, tmp_path: Path) -> None:
    binary = install_claude()
    run = claude(
        binary,
        tmp_path,
        f"{demo.url}/opencode",
        prompt=PROMPT,
        flags=["--permission-mode", "acceptEdits"],
        timeout=RUN_TIMEOUT,
    )
    assert_created(run, tmp_path / "project", demo)


def test_codex_creates_hello_py(demo: Daemon, tmp_path: Path) -> None:
    binary = install_codex()
    run = codex(
        binary,
        tmp_path,
        f"{demo.url}/opencode/v1",
        prompt=PROMPT,
        flags=["--dangerously-bypass-approvals-and-sandbox"],
        timeout=RUN_TIMEOUT,
    )
    assert_created(run, tmp_path / "project", demo)


def test_opencode_creates_hello_py(demo: Daemon, tmp_path: Path) -> None:
    binary = install_opencode()
    project = tmp_path / "project"
    project.mkdir()
    settings = opencode_json(f"{demo.url}/opencode/v1")
    (project / "opencode.json").write_text(json.dumps(settings, indent=2) + "\n")
    argv = [str(binary), "run", "--model", f"lab/{MODEL}", PROMPT]
    run = run_agent(argv, project, opencode_env(tmp_path / "home"), RUN_TIMEOUT)
    assert_created(run, project, demo)

"""Claude Code and Codex through crossbar: ``claude -p`` and ``codex exec`` against ``--demo``,
and what each prints when crossbar itself refuses a request.

Both are installed from npm at pinned versions, once, into the cache outside the repository
(``${LLAMA_CROSSBAR_CACHE:-$HOME/.cache/llama-crossbar}/claude-code-<version>/`` and
``codex-<version>/``, about 360 and 400 MB unpacked); when npm cannot install them the tests
are skipped with the reason, or fail when ``CROSSBAR_REQUIRE_OPENCODE`` is set, as OpenCode's
(``tests/system/test_opencode.py``). Each run is sandboxed (see :mod:`tests.support.agents`).

Claude Code speaks Anthropic's Messages API (``POST /<route>/v1/messages?beta=true``) and Codex
OpenAI's Responses API (``POST /<route>/v1/responses``); the demo's simulated hosts answer
both as llama-server does. About 3 s a run once the cache is filled.

Asked to create ``hello.py``, each creates it: the demo answers with the tool call that writes
it, then ends the turn. Each runs headless as a person tries it: Claude Code with
``--permission-mode acceptEdits`` (its Write tool; ``--dangerously-skip-permissions`` is refused
to root), Codex with ``--dangerously-bypass-approvals-and-sandbox`` (its ``exec_command`` runs
the demo's ``echo``; its own sandbox needs user namespaces that containers may refuse).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, Daemon, demo_route_ready, start_daemon
from tests.support.agents import (
    CREATE,
    CREATED,
    claude,
    claude_settings,
    codex,
    codex_config,
)

DOC = REPO / "docs" / "clients.md"
PLACEHOLDER = "http://crossbar:7777"

CROSSBAR_TIMEOUT = 30.0
LOG_TIMEOUT = 10.0
ALPHABET = "abcdefghijklmnopqrstuvwxyz" * 3


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


def simulated_answer(printed: str) -> bool:
    """Whether the demo's answer (the alphabet from "a", 8 to 60 letters) was printed."""
    return any(ALPHABET.startswith(w) for w in re.findall(r"[a-z]{8,}", printed))


def logged(daemon: Daemon, pattern: str) -> int:
    """How many of crossbar's access log lines match ``pattern``, once one does."""
    line = re.compile(pattern)
    daemon.wait(lambda: bool(line.search(daemon.output())), LOG_TIMEOUT)
    return len(line.findall(daemon.output()))


# -- answers --------------------------------------------------------------------------------------


def test_claude_code_answers_through_crossbar(
    claude_bin: Path, demo: Daemon, tmp_path: Path
) -> None:
    """As docs/clients.md says, with no model named: the demo route's aliases map Claude
    Code's own names to its model, which the host is asked for."""
    run = claude(claude_bin, tmp_path, f"{demo.url}/opencode", model=None)
    report = f"{run.report()}\ncrossbar:\n{demo.log()}"
    assert run.code == 0, report
    assert simulated_answer(run.out), f"no simulated answer printed\n{report}"
    served = r"opencode gpu-[ab] POST /v1/messages 200 \d+ms model=claude-[\w.-]+->qwen3-coder-30b"
    assert logged(demo, served) >= 1, report
    assert "Traceback" not in demo.output(), report


def test_codex_answers_through_crossbar(codex_bin: Path, demo: Daemon, tmp_path: Path) -> None:
    run = codex(codex_bin, tmp_path, f"{demo.url}/opencode/v1")
    report = f"{run.report()}\ncrossbar:\n{demo.log()}"
    assert run.code == 0, report
    assert simulated_answer(run.out), f"no simulated answer printed\n{report}"
    assert logged(demo, r"opencode gpu-a POST /v1/responses 200 \d+ms") >= 1, report
    assert "Traceback" not in demo.output(), report


HEADLESS = {
    "claude": ["--permission-mode", "acceptEdits"],
    "codex": ["--dangerously-bypass-approvals-and-sandbox"],
}
"""Each agent's flags to run the demo's tool call without asking anyone."""


@pytest.mark.parametrize("agent", list(HEADLESS))
def test_each_agent_creates_hello_py_through_crossbar(
    agent: str, demo: Daemon, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    binary = request.getfixturevalue(f"{agent}_bin")
    if agent == "claude":
        run = claude(binary, tmp_path, f"{demo.url}/opencode", prompt=CREATE, flags=HEADLESS[agent])
    else:
        run = codex(
            binary, tmp_path, f"{demo.url}/opencode/v1", prompt=CREATE, flags=HEADLESS[agent]
        )
    report = f"{run.report()}\ncrossbar:\n{demo.log()}"
    assert run.code == 0, report
    hello = tmp_path / "project" / "hello.py"
    assert hello.is_file() and hello.read_text() == CREATED, report
    assert "Created hello.py." in run.out, report


# -- crossbar's own errors, as each agent prints them -------------------------------------------


PRINTED = {
    "claude": {
        "401": "Failed to authenticate. API Error: 401 unauthorized: key not known",
        "404": "There's an issue with the selected model (qwen3-coder-30b). It may not exist",
        "413": "Request too large (max 32MB).",
        "502": "API Error: 502 upstream failed (host gpu-a).",
        "503": "API Error: 503 no healthy host for route ",
        "504": "API Error: 504 upstream timeout (host gpu-b).",
    },
    "codex": {
        "401": "ERROR: unexpected status 401 Unauthorized: unauthorized: key not known, url: ",
        "404": "ERROR: unexpected status 404 Not Found: unknown route, url: ",
        "413": "ERROR: unexpected status 413 Payload Too Large: body too large, url: ",
        "502": "ERROR: unexpected status 502 Bad Gateway: upstream failed (host gpu-a), url: ",
        "503": "ERROR: unexpected status 503 Service Unavailable: no healthy host for route ",
        "504": "ERROR: unexpected status 504 Gateway Timeout: upstream timeout (host gpu-b), url: ",
    },
}
"""What each agent prints on each of crossbar's errors, as docs/clients.md lists it: crossbar's
words (Claude Code's ``API Error: <status> <message>`` of Anthropic's shape, Codex's
``error.message`` of llama-server's), but for Claude Code's own words on a 404 and a 413."""


@pytest.mark.parametrize("status", list(PRINTED["claude"]))
@pytest.mark.parametrize("agent", list(PRINTED))
def test_crossbars_errors_reach_the_person(
    agent: str,
    status: str,
    refusing: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Each agent, its retries off, exits 1 on crossbar's own error and prints what
    :data:`PRINTED` says (also in the test's output, ``pytest -rP``)."""
    base, key = refusing[status].split()
    if agent == "claude":
        run = claude(request.getfixturevalue("claude_bin"), tmp_path, base, key, retries=0)
    else:
        run = codex(request.getfixturevalue("codex_bin"), tmp_path, f"{base}/v1", key, retries=0)
    lines = [line for line in run.out.splitlines() + run.err.splitlines() if line.strip()]
    said = [line for line in lines if status in line] or run.out.strip().splitlines()[-3:]
    print(f"{agent} on crossbar's {status}: exit {run.code}")
    print("\n".join(dict.fromkeys(said)))
    assert run.code == 1, run.report()
    expected = PRINTED[agent][status]
    assert any(expected in line for line in lines), f"expected {expected!r}\n{run.report()}"


# -- the documentation --------------------------------------------------------------------------


def _doc_block(marker: str) -> str:
    found = re.search(rf"<!-- {marker} -->\s*\n```\w+\n(.*?)\n```", DOC.read_text(), re.S)
    assert found, f"docs/clients.md has no block marked <!-- {marker} -->"
    return found.group(1)


def test_docs_give_what_the_tests_run() -> None:
    """docs/clients.md's Claude Code and Codex settings are the ones run here, word for word."""
    block = _doc_block("claude-code")
    *exports, command = block.splitlines()
    assert command == 'claude -p "say hi"'
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    shown = subprocess.run(
        ["sh", "-c", "\n".join([*exports, "env"])], capture_output=True, env=env, check=True
    )
    documented = dict(line.split("=", 1) for line in shown.stdout.decode().splitlines())
    expected = claude_settings(f"{PLACEHOLDER}/opencode", "unused")
    assert {k: documented.get(k) for k in expected} == expected
    assert set(documented) - set(expected) <= {"PATH", "PWD", "SHLVL", "_", "OLDPWD"}
    assert _doc_block("codex") + "\n" == codex_config(f"{PLACEHOLDER}/opencode/v1")


def test_docs_list_what_each_agent_prints_on_crossbar_s_errors() -> None:
    """docs/clients.md's table of crossbar's errors has each agent's words, as run above."""
    text = DOC.read_text()
    section = text.split("\n## When crossbar refuses a request\n", 1)[1].split("\n## ", 1)[0]
    for agent, printed in PRINTED.items():
        for status, words in printed.items():
            assert words in section, f"docs/clients.md lacks {agent}'s {status}: {words}"

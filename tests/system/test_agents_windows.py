"""Claude Code and Codex against hosts of different windows, through crossbar: a session whose
context outgrows the small host's window goes on, moved to the larger host; on a fleet whose
every host is small, Claude Code compacts its conversation and goes on (its compaction is in
its own transcript), and where an agent cannot go on the person reads why.

Each test starts two simulated hosts (``python -m crossbar.testing.simulator --ctx N``, each
refusing a prompt too long for its slot as llama-server does) and a crossbar daemon routing
``lab`` to ``small`` first, then ``big``. The agents are the pinned ones of
tests/system/test_agents.py (installed once into the cache, run sandboxed:
:mod:`tests.support.agents`). The simulator counts ``word `` as two tokens; Claude Code's
first request is about 7,800 of them (its system prompt and tools), Codex's about 9,300.
Claude Code asks for ``max_tokens`` 32,000 and Codex for none (crossbar keeps 1,024).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import Daemon, start_daemon, start_simulator
from tests.support.agents import (
    Run,
    claude,
    claude_settings,
    codex,
    run_agent,
)
from tests.support.npm import sandbox_env

MODEL = "qwen3-coder-30b"
LOG_TIMEOUT = 10.0
CROSSBAR_TIMEOUT = 30.0


class Fleet:
    """Two simulated hosts, ``small`` and ``big``, and a crossbar in front (route ``lab``)."""

    def __init__(self, tmp: Path, small: int, big: int) -> None:
        self.daemons: list[Daemon] = []
        urls = {}
        for name, window in (("small", small), ("big", big)):
            folder = tmp / name
            folder.mkdir()
            options = ("--models", f"{MODEL}=loaded", "--ctx", str(window), "--chunks", "12")
            sim = start_simulator(folder, *options)
            self.daemons.append(sim)
            urls[name] = sim.url
        folder = tmp / "crossbar"
        folder.mkdir()
        yaml = (
            f"poll_interval: 250ms\nhosts:\n  small: {urls['small']}\n  big: {urls['big']}\n"
            f"routes:\n  lab: {{hosts: [small, big], default_model: {MODEL}}}\n"
        )
        self.crossbar = start_daemon(folder, yaml, timeout=CROSSBAR_TIMEOUT, ready=_windows_read)
        self.daemons.append(self.crossbar)

    def access(self, count: int) -> list[str]:
        """The first ``count`` access lines, once there are that many."""
        line = re.compile(r"\[crossbar\.access#info\] (.*)")
        self.crossbar.wait(lambda: len(line.findall(self.crossbar.output())) >= count, LOG_TIMEOUT)
        return line.findall(self.crossbar.output())

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()


def _windows_read(daemon: Daemon) -> bool:
    """Whether crossbar knows both hosts' windows (its status JSON shows each host's)."""
    try:
        with urllib.request.urlopen(f"{daemon.url}/_crossbar/status", timeout=2) as answer:
            text: str = answer.read().decode()
    except OSError:
        return False
    return text.count('"windows"') >= 2


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[[int, int], Fleet]]:
    made: list[Fleet] = []

    def make(small: int, big: int) -> Fleet:
        made.append(Fleet(tmp_path, small, big))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def words(count: int) -> str:
    return "please read this, then say hi: " + "word " * count


def claude_again(binary: Path, home: Path, base_url: str, prompt: str) -> Run:
    """``claude -p --continue PROMPT``: the next turn of the session :func:`claude` began."""
    env = {**sandbox_env(home / "home"), **claude_settings(base_url, "unused", MODEL)}
    env["CLAUDE_CODE_MAX_RETRIES"] = "0"
    return run_agent([str(binary), "-p", "--continue", prompt], home / "project", env)


def codex_again(binary: Path, home: Path, prompt: str) -> Run:
    """``codex exec resume --last PROMPT``: the next turn of the session :func:`codex` began."""
    env = sandbox_env(home / "home")
    env |= {"CODEX_HOME": str(Path(env["HOME"]) / ".codex"), "CROSSBAR_KEY": "unused"}
    argv = [str(binary), "exec", "--skip-git-repo-check", "resume", "--last", prompt]
    return run_agent(argv, home / "project", env)


def shown(run: Run, fleet: Fleet) -> str:
    """A failure's report, without the long prompts an agent echoes."""
    report = re.sub(r"(word ){20,}", "word ... ", run.report())
    return f"{report}\ncrossbar:\n{fleet.crossbar.log()}"


# -- a session outgrows the small host ---------------------------------------------------------


def test_a_claude_code_session_that_outgrows_the_small_host_goes_on_on_the_big_one(
    claude_bin: Path, fleet: Callable[[int, int], Fleet], tmp_path: Path
) -> None:
    hosts = fleet(56_000, 131_072)
    base = f"{hosts.crossbar.url}/lab"
    run = claude(claude_bin, tmp_path / "agent", base, retries=0)
    assert run.code == 0, shown(run, hosts)
    assert hosts.access(1)[0].startswith("lab small POST /v1/messages 200 ")
    run = claude_again(claude_bin, tmp_path / "agent", base, words(24_000))  # ~48,000 tokens
    assert run.code == 0 and "abcdefgh" in run.out, shown(run, hosts)
    last = hosts.access(2)[-1]
    assert last.startswith("lab big POST /v1/messages 200 "), shown(run, hosts)
    assert "too long for small" in last or "> small's window 56000" in last


def test_a_codex_session_that_outgrows_the_small_host_goes_on_on_the_big_one(
    codex_bin: Path, fleet: Callable[[int, int], Fleet], tmp_path: Path
) -> None:
    hosts = fleet(24_000, 131_072)
    run = codex(codex_bin, tmp_path / "agent", f"{hosts.crossbar.url}/lab/v1", retries=0)
    assert run.code == 0, shown(run, hosts)
    assert hosts.access(1)[0].startswith("lab small POST /v1/responses 200 ")
    run = codex_again(codex_bin, tmp_path / "agent", words(15_000))  # ~30,000 tokens
    assert run.code == 0 and "abcdefgh" in run.out, shown(run, hosts)
    last = hosts.access(2)[-1]
    assert last.startswith("lab big POST /v1/responses 200 "), shown(run, hosts)
    assert "too long for small" in last or "> small's window 24000" in last


# -- every host small --------------------------------------------------------------------------


def test_claude_code_compacts_its_conversation_when_every_host_is_small_and_goes_on(
    claude_bin: Path, fleet: Callable[[int, int], Fleet], tmp_path: Path
) -> None:
    """Turns of ~3,000 tokens each, on hosts of 16,000: the fourth is refused (crossbar's
    ``prompt is too long``), and Claude Code summarises the conversation and answers."""
    hosts = fleet(16_000, 16_000)
    base = f"{hosts.crossbar.url}/lab"
    agent = tmp_path / "agent"
    run = claude(claude_bin, agent, base, retries=0)
    assert run.code == 0, shown(run, hosts)
    for _ in range(3):
        run = claude_again(claude_bin, agent, base, words(1_500))
        assert run.code == 0 and "abcdefgh" in run.out, shown(run, hosts)
    lines = hosts.access(5)
    refused = [n for n, line in enumerate(lines) if " 400 " in line]
    assert refused, shown(run, hosts)
    assert "(too long for every host: " in lines[refused[0]]
    assert any(" 200 " in line for line in lines[refused[0] + 1 :])  # the summary, and on
    [transcript] = (agent / "home").rglob("*.jsonl")
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line]
    boundaries = [e for e in entries if e.get("subtype") == "compact_boundary"]
    assert boundaries, "Claude Code did not compact"
    assert any(e.get("isCompactSummary") for e in entries)


def test_claude_code_tells_the_person_when_its_first_request_fits_no_host(
    claude_bin: Path, fleet: Callable[[int, int], Fleet], tmp_path: Path
) -> None:
    hosts = fleet(4_096, 4_096)
    run = claude(claude_bin, tmp_path / "agent", f"{hosts.crossbar.url}/lab", retries=0)
    assert run.code == 1, shown(run, hosts)
    said = re.search(r"Prompt is too long · the request is ~(\d+) tokens \(limit 4096\)", run.out)
    assert said, shown(run, hosts)
    assert "A single-exchange conversation cannot be compacted" in run.out
    [line] = hosts.access(1)
    assert " POST /v1/messages 400 " in line
    assert line.endswith(f"(too long for every host: {said.group(1)} tokens > small's window 4096)")


def test_codex_tells_the_person_when_its_request_fits_no_host(
    codex_bin: Path, fleet: Callable[[int, int], Fleet], tmp_path: Path
) -> None:
    hosts = fleet(4_096, 4_096)
    run = codex(codex_bin, tmp_path / "agent", f"{hosts.crossbar.url}/lab/v1", retries=0)
    assert run.code == 1, shown(run, hosts)
    said = (
        "ERROR: Codex ran out of room in the model's context window. Start a new thread or"
        " clear earlier history before retrying."
    )
    assert said in run.err, shown(run, hosts)
    assert " POST /v1/responses 400 " in hosts.access(1)[0]


@pytest.mark.soak
def test_opencode_compacts_when_its_request_fits_no_host_and_prints_crossbar_s_words(
    fleet: Callable[[int, int], Fleet], tmp_path: Path
) -> None:
    """OpenCode compacts on ``context_length_exceeded`` (its summary request is answered)
    and sends the turn again; when its own system prompt and tools alone outgrow every
    host, it does so again and again, printing crossbar's words each time, until stopped.
    Opt-in (``-m soak``): a run lasts its whole timeout (20 s)."""
    from tests.support.opencode import install_opencode, opencode_env, opencode_json

    hosts = fleet(4_096, 4_096)
    project = tmp_path / "project"
    project.mkdir()
    settings = opencode_json(f"{hosts.crossbar.url}/lab/v1")
    (project / "opencode.json").write_text(json.dumps(settings))
    argv = [str(install_opencode()), "run", "--model", f"lab/{MODEL}", "say hi"]
    run = run_agent(argv, project, opencode_env(tmp_path / "home"), timeout=20)
    assert run.code is None, shown(run, hosts)  # it never gave up by itself
    said = re.search(
        r"Error: This model's maximum context length is 4096 tokens\. However, your messages"
        r" resulted in (\d+) tokens\.",
        run.out + run.err,
    )
    assert said, shown(run, hosts)
    lines = hosts.access(3)
    refused = [n for n, line in enumerate(lines) if " 400 " in line]
    assert refused and "(too long for every host: " in lines[refused[0]]
    assert any(" 200 " in line for line in lines[refused[0] + 1 :])  # its summary request

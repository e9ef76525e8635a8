"""Claude Code and Codex, the coding agents the tests run through crossbar: pinned, installed
once from npm into the cache (see :func:`tests.support.npm.install_npm_package`), and run in a
sandbox of their own.

Each run gets a private HOME (and XDG dirs), an environment of its own (none of the user's
variables or keys), its telemetry, error reports and update checks turned off, its retries
as the caller says, and every address but 127.0.0.1 unreachable: proxies point at a closed
loopback port. Their settings are the ones ``docs/clients.md`` gives, word for word
(:func:`claude_settings`, :func:`codex_config`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from tests.support.npm import install_npm_package, sandbox_env

CLAUDE_VERSION = "2.1.328"
"""The pinned ``@anthropic-ai/claude-code`` (its binary is the optional dependency
``@anthropic-ai/claude-code-linux-x64``, linked into place by the package's postinstall)."""

CODEX_VERSION = "0.169.0"
"""The pinned ``@openai/codex`` (its binary: the optional dependency ``codex-linux-x64``)."""

MODEL = "qwen3-coder-30b"
"""The demo's default model of route ``opencode``, loaded on gpu-a."""

CREATE = "create hello.py that prints hello"
"""A prompt that asks for a file: the demo's hosts answer it with the tool call that writes
``hello.py`` (:data:`CREATED`), and end the turn after the tool's result."""

CREATED = 'print("hello")\n'
"""What ``hello.py`` holds once an agent has run the demo's tool call."""

INSTALL_TIMEOUT = 600.0
VERSION_TIMEOUT = 30.0
RUN_TIMEOUT = 120.0

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def claude_settings(base_url: str, key: str, model: str | None = None) -> dict[str, str]:
    """Claude Code's environment for a route (docs/clients.md): its base URL (without
    ``/v1``: Claude Code adds ``/v1/messages``) and a key; with ``model``, that model for
    every request, its side requests (the "haiku" ones) too (without: its own Claude names,
    which the route's ``aliases`` map)."""
    names = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL")
    names += ("ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    models = {} if model is None else dict.fromkeys(names, model)
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": key,
        **models,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def codex_config(base_url: str, model: str = MODEL, retries: int | None = None) -> str:
    """Codex's ``config.toml`` for a route (docs/clients.md); ``retries`` sets the
    provider's request and stream retries (Codex's default: 4 and 5)."""
    lines = [
        f'model = "{model}"',
        'model_provider = "crossbar"',
        "check_for_update_on_startup = false",
        "",
        "[model_providers.crossbar]",
        'name = "crossbar"',
        f'base_url = "{base_url}"',
        'wire_api = "responses"',
        'env_key = "CROSSBAR_KEY"',
    ]
    if retries is not None:
        lines += [f"request_max_retries = {retries}", f"stream_max_retries = {retries}"]
    lines += ["", "[analytics]", "enabled = false", "", "[feedback]", "enabled = false"]
    return "\n".join(lines) + "\n"


# -- the installs, cached -----------------------------------------------------------------------


def _runs(binary: Path, version: str) -> bool:
    """Whether ``binary`` runs and says it is ``version`` (asked with a throwaway HOME)."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    with tempfile.TemporaryDirectory(prefix="agent-version-") as home:
        try:
            done = subprocess.run(
                [str(binary), "--version"],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                env={**sandbox_env(Path(home)), "CODEX_HOME": home},
                timeout=VERSION_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0 and version in done.stdout.decode(errors="replace")


def _install(package: str, version: str, entry: str, title: str, command: str) -> Path:
    def binary(prefix: Path) -> Path:
        return prefix / "node_modules" / ".bin" / command

    prefix = install_npm_package(
        package,
        version,
        lambda prefix: _runs(binary(prefix), version),
        entry=entry,
        title=title,
        install_timeout=INSTALL_TIMEOUT,
        allow_scripts=True,
    )
    return binary(prefix)


def install_claude() -> Path:
    """The pinned Claude Code's ``claude``, installed into the cache first if need be."""
    return _install(
        "@anthropic-ai/claude-code", CLAUDE_VERSION, "claude-code", "Claude Code", "claude"
    )


def install_codex() -> Path:
    """The pinned Codex's ``codex``, installed into the cache first if need be."""
    return _install("@openai/codex", CODEX_VERSION, "codex", "Codex", "codex")


# -- a run --------------------------------------------------------------------------------------


@attrs.frozen
class Run:
    """How an agent's run ended, and what it printed (without colours)."""

    code: int | None  # None: it did not end in time, and was killed
    out: str
    err: str

    def report(self, lines: int = 30) -> str:
        out, err = _tail(self.out, lines), _tail(self.err, lines)
        return f"exit {self.code}\nstdout:\n{out}\nstderr:\n{err}"


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(nothing)"


def run_agent(
    argv: list[str], cwd: Path, env: Mapping[str, str], timeout: float = RUN_TIMEOUT
) -> Run:
    """Run an agent to its end (or kill it, and whatever it started, after ``timeout``)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that whatever it starts is ended with it
    )
    code: int | None
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        code = None
    finally:
        _kill(proc)
    return Run(
        code, ANSI.sub("", out.decode(errors="replace")), ANSI.sub("", err.decode(errors="replace"))
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def claude(
    binary: Path,
    home: Path,
    base_url: str,
    key: str = "unused",
    retries: int | None = None,
    *,
    model: str | None = MODEL,
    extra: Mapping[str, str] | None = None,
    timeout: float = RUN_TIMEOUT,
    prompt: str = "say hi",
    flags: Sequence[str] = (),
) -> Run:
    """``claude -p [flags] "say hi"`` against ``base_url`` (``retries``: Claude Code's own,
    else its default of 10; ``model``: every request's, ``None``: Claude Code's own names;
    ``extra``: more of its environment; ``prompt``: another one)."""
    project = home / "project"
    project.mkdir(parents=True, exist_ok=True)
    env = {**sandbox_env(home / "home"), **claude_settings(base_url, key, model), **(extra or {})}
    if retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(retries)
    return run_agent([str(binary), "-p", *flags, prompt], project, env, timeout)


def codex(
    binary: Path,
    home: Path,
    base_url: str,
    key: str = "unused",
    retries: int | None = None,
    *,
    model: str = MODEL,
    timeout: float = RUN_TIMEOUT,
    prompt: str = "say hi",
    flags: Sequence[str] = (),
) -> Run:
    """``codex exec --skip-git-repo-check [flags] "say hi"`` with :func:`codex_config` for
    ``base_url``, the key in ``CROSSBAR_KEY`` (``prompt``: another one)."""
    project = home / "project"
    project.mkdir(parents=True, exist_ok=True)
    env = sandbox_env(home / "home")
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model, retries))
    env |= {"CODEX_HOME": str(codex_home), "CROSSBAR_KEY": key}
    argv = [str(binary), "exec", "--skip-git-repo-check", *flags, prompt]
    return run_agent(argv, project, env, timeout)

"""The snippets of ``docs/clients.md``, run as they are written there.

Each fenced block after a ``<!-- test: NAME -->`` marker is taken from the document, its
``http://crossbar:7777`` replaced by a crossbar on 127.0.0.1 (a route ``opencode`` with no
keys, a route ``private`` with one), and run: Python with this venv's interpreter, shell
with ``sh`` (skipped without curl), JavaScript with ``node`` and the ``openai`` npm package.

On crossbar's own errors the Node SDK's ``err.message`` is the status and crossbar's words
(:data:`NODE_PRINTED`), asked of crossbars that answer each error themselves.

That package is installed at a pinned version, once, into the cache the OpenCode test uses
(``${LLAMA_CROSSBAR_CACHE:-$HOME/.cache/llama-crossbar}/openai-node-<version>/``, by
:func:`tests.support.npm.install_npm_package`); when npm cannot install it the Node test is
skipped with the reason (a failure when ``CROSSBAR_REQUIRE_OPENCODE`` is set, as for
OpenCode).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, Daemon, start_daemon, start_simulator
from tests.support.errors import api_error
from tests.support.npm import install_npm_package

DOC = REPO / "docs" / "clients.md"
PLACEHOLDER = "http://crossbar:7777"
MODEL = "qwen3-coder-30b"
KEY = "sk-clients-doc"
ALPHABET = "abcdefghijklmnopqrstuvwxyz" * 3

OPENAI_NODE_VERSION = "7.59.0"
"""The pinned ``openai`` package on npm."""

RUN_TIMEOUT = 30.0
INSTALL_TIMEOUT = 300.0

MARKER = re.compile(r"<!-- test: ([\w-]+) -->\s*\n\s*```(\w+)\n(.*?)\n\s*```", re.S)

CONFIG = """\
poll_interval: 1h
hosts:
  gpu-a: {url}
routes:
  opencode:
    hosts: [gpu-a]
    default_model: {model}
    list_models: merged
  private:
    hosts: [gpu-a]
    default_model: {model}
    api_keys: ["{key}"]
"""


def snippets() -> dict[str, tuple[str, str]]:
    """The document's tested blocks: marker name -> (language, code), indentation removed."""
    found: dict[str, tuple[str, str]] = {}
    for name, language, body in MARKER.findall(DOC.read_text()):
        lines = body.splitlines()
        indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
        found[name] = (language, "\n".join(line[indent:] for line in lines) + "\n")
    return found


def test_every_marked_snippet_is_found() -> None:
    assert set(snippets()) == {"curl-models", "python", "python-stream", "node", "curl-stream"}


@pytest.fixture(scope="module")
def crossbar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("clients")
    sim = start_simulator(
        tmp, "--models", f"{MODEL}=loaded", "--load-time", "0", "--chunk-interval", "0.01"
    )
    daemon = None
    try:
        daemon = start_daemon(tmp, CONFIG.format(url=sim.url, model=MODEL, key=KEY))
        assert daemon.wait(lambda: "host gpu-a is up" in daemon.output(), 10), daemon.log()
        yield daemon
    finally:
        if daemon is not None:
            daemon.stop()
        sim.stop()


def run(
    name: str,
    crossbar: Daemon,
    tmp: Path,
    route: str = "opencode",
    key: str | None = None,
    command: list[str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run snippet ``name`` against ``route``, with ``CROSSBAR_KEY`` set to ``key`` if given."""
    language, code = snippets()[name]
    code = code.replace(f"{PLACEHOLDER}/opencode/v1", f"{crossbar.url}/{route}/v1")
    assert PLACEHOLDER not in code, code
    suffix = {"python": ".py", "sh": ".sh", "js": ".mjs"}[language]
    script = (cwd or tmp) / f"{name}-{route}{suffix}"
    script.write_text(code)
    if command is None:
        command = {"python": [sys.executable], "sh": ["sh"]}[language]
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp), "LANG": "C.UTF-8"}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1"
    if key is not None:
        env["CROSSBAR_KEY"] = key
    return subprocess.run(
        [*command, str(script)],
        capture_output=True,
        text=True,
        cwd=cwd or tmp,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def answered(done: subprocess.CompletedProcess[str]) -> str:
    """The simulated answer the snippet printed (the alphabet from "a", 8 to 60 letters)."""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    text = done.stdout.strip()
    assert len(text) >= 8 and ALPHABET.startswith(text), done.stdout
    return text


# -- Python --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["python", "python-stream"])
def test_python_snippet_answers_on_an_open_route(
    name: str, crossbar: Daemon, tmp_path: Path
) -> None:
    answered(run(name, crossbar, tmp_path))


@pytest.mark.parametrize("name", ["python", "python-stream"])
def test_python_snippet_answers_on_a_keyed_route_with_its_key(
    name: str, crossbar: Daemon, tmp_path: Path
) -> None:
    answered(run(name, crossbar, tmp_path, route="private", key=KEY))
    refused = run(name, crossbar, tmp_path, route="private")
    assert refused.returncode != 0
    assert "401" in refused.stderr and "AuthenticationError" in refused.stderr, refused.stderr


# -- curl ----------------------------------------------------------------------------------------


@pytest.fixture
def curl() -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not on PATH")


@pytest.mark.usefixtures("curl")
def test_curl_lists_the_models_to_name(crossbar: Daemon, tmp_path: Path) -> None:
    done = run("curl-models", crossbar, tmp_path)
    assert done.returncode == 0, done.stderr
    assert MODEL in [m["id"] for m in json.loads(done.stdout)["data"]]


@pytest.mark.usefixtures("curl")
def test_curl_streams_with_the_key_and_is_refused_without(crossbar: Daemon, tmp_path: Path) -> None:
    done = run("curl-stream", crossbar, tmp_path, route="private", key=KEY)
    assert done.returncode == 0, done.stderr
    events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]", done.stdout
    pieces = [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1]]
    text = "".join(p for p in pieces if p)
    assert len([p for p in pieces if p]) >= 8 and ALPHABET.startswith(text), done.stdout

    refused = run("curl-stream", crossbar, tmp_path, route="private", key="")
    assert "data:" not in refused.stdout
    assert json.loads(refused.stdout) == api_error(401, "unauthorized: no key sent")


# -- Node ----------------------------------------------------------------------------------------


def _node_ready(prefix: Path) -> bool:
    package = prefix / "node_modules" / "openai" / "package.json"
    try:
        return json.loads(package.read_text())["version"] == OPENAI_NODE_VERSION
    except (OSError, ValueError, KeyError):
        return False


def install_openai_node() -> Path:
    """The folder holding ``node_modules/openai`` at the pinned version, installed if need be."""
    if shutil.which("node") is None:
        pytest.skip("node is not on PATH")
    return install_npm_package(
        "openai",
        OPENAI_NODE_VERSION,
        _node_ready,
        entry="openai-node",
        install_timeout=INSTALL_TIMEOUT,
    )


def test_node_snippet_streams_an_answer(crossbar: Daemon, tmp_path: Path) -> None:
    prefix = install_openai_node()
    project = tmp_path / "project"
    project.mkdir()
    (project / "node_modules").symlink_to(prefix / "node_modules")
    (project / "package.json").write_text('{"private": true}\n')
    node = shutil.which("node") or "node"
    answered(run("node", crossbar, tmp_path, command=[node], cwd=project))
    answered(run("node", crossbar, tmp_path, route="private", key=KEY, command=[node], cwd=project))
    refused = run("node", crossbar, tmp_path, route="private", command=[node], cwd=project)
    assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr


NODE_ERRORS = """\
import OpenAI from "openai";

const found = {};
for (const [status, base, key, size] of JSON.parse(process.argv[2])) {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
  try {
    await client.chat.completions.create({
      model: "qwen3-coder-30b",
      messages: [{ role: "user", content: "x".repeat(size) }],
    });
    found[status] = "answered";
  } catch (err) {
    found[status] = err.message;
  }
}
console.log(JSON.stringify(found));
"""
"""Asks for a chat completion at each base URL, its retries off, and prints what each
error's ``message`` said."""

NODE_PRINTED = {
    "401": "401 unauthorized: key not known",
    "404": "404 unknown route",
    "413": "413 body too large",
    "503": "503 no healthy host for route lab: gpu-c down (health: connection refused)",
}
"""``err.message`` of the OpenAI Node SDK on crossbar's own errors, as docs/clients.md says:
the status and crossbar's words (``error.message`` of llama-server's shape)."""


def test_the_node_sdk_shows_crossbar_s_words(refusing: dict[str, str], tmp_path: Path) -> None:
    prefix = install_openai_node()
    project = tmp_path / "project"
    project.mkdir()
    (project / "node_modules").symlink_to(prefix / "node_modules")
    (project / "package.json").write_text('{"private": true}\n')
    script = project / "errors.mjs"
    script.write_text(NODE_ERRORS)
    cases = [[s, *refusing[s].split(), 2000 if s == "413" else 2] for s in NODE_PRINTED]
    done = subprocess.run(
        [shutil.which("node") or "node", str(script), json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=project,
        env={"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path), "NO_PROXY": "*"},
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    assert json.loads(done.stdout) == NODE_PRINTED

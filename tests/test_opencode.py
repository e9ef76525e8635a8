"""A real coding agent through crossbar: OpenCode's ``opencode run`` against ``--demo``.

OpenCode is installed from npm at a pinned version, once, into a cache outside the
repository (as ``scripts/llama-server.sh`` caches its binary)::

    ${LLAMA_CROSSBAR_CACHE:-$HOME/.cache/llama-crossbar}/opencode-<version>/

It is built in a temporary folder next to that and published with one rename, under a lock,
so an interrupted install never looks finished. When npm cannot install it (no npm, no
registry, a failed install) the test is skipped with the reason; set
``CROSSBAR_REQUIRE_OPENCODE`` to a non-empty value to make that a failure instead.

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
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support import REPO, TWISTD, Daemon, accepts, free_port

OPENCODE_VERSION = "1.18.33"
"""The pinned ``opencode-ai`` on npm (its platform binary comes as an optional dependency,
``opencode-linux-x64``, linked into place by the package's postinstall)."""

MODEL = "qwen3-coder-30b"
"""The demo's default model of route ``opencode``, loaded on gpu-a."""

REQUIRE_ENV = "CROSSBAR_REQUIRE_OPENCODE"

# Bounds of every wait here.
REGISTRY_TIMEOUT = 60.0
INSTALL_TIMEOUT = 600.0
LOCK_TIMEOUT = INSTALL_TIMEOUT + 60.0
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


def _unavailable(reason: str) -> NoReturn:
    """Skip (or fail, when OpenCode is required) because npm could not install OpenCode."""
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(f"OpenCode {OPENCODE_VERSION} could not be installed from npm: {reason}")


def _tail(text: str | bytes | None, lines: int = 30) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:]) or "(nothing)"


def private_dirs(home: Path) -> dict[str, str]:
    """HOME, the XDG dirs and TMPDIR, all inside ``home``: what OpenCode may write."""
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_RUNTIME_DIR": home / "run",
        "TMPDIR": home / "tmp",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    (home / "run").chmod(0o700)
    return {name: str(path) for name, path in dirs.items()}


def opencode_env(home: Path) -> dict[str, str]:
    """An environment of OpenCode's own: private dirs, no network but 127.0.0.1."""
    nowhere = f"http://127.0.0.1:{free_port()}"  # refused: nothing listens there
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        **private_dirs(home),
        # Anything but loopback goes through a proxy that refuses; npm's registry too.
        "HTTP_PROXY": nowhere,
        "HTTPS_PROXY": nowhere,
        "ALL_PROXY": nowhere,
        "http_proxy": nowhere,
        "https_proxy": nowhere,
        "all_proxy": nowhere,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "npm_config_registry": f"{nowhere}/",
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


def _cache_root() -> Path:
    root = os.environ.get("LLAMA_CROSSBAR_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "llama-crossbar"


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


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One install at a time per cache entry; a bounded wait for another one."""
    with path.open("w") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    _unavailable(f"another install still holds {path} after {LOCK_TIMEOUT:.0f} s")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _npm(
    args: list[str],
    env: dict[str, str],
    timeout: float,
    what: str,
    unavailable: Callable[[str], NoReturn] = _unavailable,
) -> None:
    """Run npm; skip (through ``unavailable``, which names the package) with its first
    error lines when it fails or does not end in time."""
    try:
        done = subprocess.run(
            args, capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        unavailable(f"{what} did not finish within {timeout:.0f} s")
    if done.returncode != 0:
        errors = done.stderr.decode(errors="replace").strip().splitlines()[:4]
        unavailable(f"{what} failed (exit {done.returncode}):\n" + "\n".join(errors))


def _npm_install(stage: Path, work: Path) -> None:
    """``npm install`` the pinned package into ``stage``, npm's cache and HOME in ``work``.

    OpenCode's postinstall runs ``opencode --version``, which makes OpenCode's folders in
    HOME: npm gets a HOME of its own, and the user's ``.npmrc`` by name. The registry is
    asked once first, without retries, so that a machine without it skips in seconds
    (npm's own retries of an install take more than a minute).
    """
    npm = shutil.which("npm")
    if npm is None:
        _unavailable("npm is not on PATH")
    env = dict(os.environ, **private_dirs(work / "home"))
    env["npm_config_cache"] = str(work / "npm-cache")
    user_npmrc = Path.home() / ".npmrc"
    if user_npmrc.is_file():
        env["npm_config_userconfig"] = str(user_npmrc)
    quiet = ["--no-update-notifier", "--loglevel=error"]
    ask = [npm, "view", f"opencode-ai@{OPENCODE_VERSION}", "version", *quiet]
    ask += ["--fetch-retries=0", "--fetch-timeout=30000"]
    _npm(ask, env, REGISTRY_TIMEOUT, "asking the npm registry for opencode-ai")

    stage.mkdir()
    (stage / "package.json").write_text(
        json.dumps(
            {
                "private": True,
                "dependencies": {"opencode-ai": OPENCODE_VERSION},
                # Its postinstall links the platform binary into place.
                "allowScripts": {"opencode-ai": True},
            },
            indent=2,
        )
    )
    install = [npm, "install", "--prefix", str(stage), "--no-audit", "--no-fund", *quiet]
    _npm(install, env, INSTALL_TIMEOUT, "npm install")
    if not _runs(_binary(stage)):
        _unavailable(f"npm installed opencode-ai, but {_binary(stage)} does not run")


def install_opencode() -> Path:
    """The pinned OpenCode's binary, installed into the cache first if need be."""
    root = _cache_root()
    dest = root / f"opencode-{OPENCODE_VERSION}"
    if _runs(_binary(dest)):
        return _binary(dest)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _unavailable(f"cannot make the cache folder {root}: {e}")
    with _locked(root / f".opencode-{OPENCODE_VERSION}.lock"):
        if _runs(_binary(dest)):  # installed while we waited
            return _binary(dest)
        # Holding the lock, a build folder left here is from an install that was killed.
        for stale in root.glob(f".build-opencode-{OPENCODE_VERSION}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".build-opencode-{OPENCODE_VERSION}.", dir=root))
        try:
            _npm_install(work / "out", work)
            if dest.exists():  # a leftover that does not run (checked above)
                dest.rename(work / "stale")
            (work / "out").rename(dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if not _runs(_binary(dest)):
        _unavailable(f"{_binary(dest)} does not run after the install")
    return _binary(dest)


@pytest.fixture(scope="module")
def opencode() -> Path:
    return install_opencode()


# -- crossbar ---------------------------------------------------------------------------------


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Daemon]:
    """``twistd -n crossbar --demo`` on a free loopback port, its route ready."""
    port = free_port()
    folder = tmp_path / "crossbar"
    folder.mkdir()
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    args = [TWISTD, "-n", "--pidfile=", "crossbar", "--demo"]
    args += ["--listen", f"tcp:{port}:interface=127.0.0.1"]
    daemon = Daemon.start(
        args, port, folder / "crossbar.log", cwd=folder, env=dict(os.environ, PYTHONPATH=path)
    )
    try:
        models = f"{daemon.url}/opencode/v1/models"
        ready = daemon.wait(lambda: accepts(port) and _status(models) == 200, CROSSBAR_TIMEOUT)
        assert ready, f"crossbar --demo did not get ready:\n{daemon.log()}"
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

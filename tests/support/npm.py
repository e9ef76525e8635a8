"""npm packages the tests run (OpenCode, the OpenAI Node SDK), installed once into a cache
outside the repository and shared by parallel runs."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from shutil import which
from typing import NoReturn

import pytest

from tests.support import free_port

REQUIRE_NPM_ENV = "CROSSBAR_REQUIRE_OPENCODE"
"""Set to a non-empty value, a package npm cannot install fails its test instead of skipping it."""

NPM_REGISTRY_TIMEOUT = 60.0


def npm_cache_root() -> Path:
    """Where npm packages are cached, outside the repository (as ``scripts/llama-server.sh``
    caches its binary): ``${LLAMA_CROSSBAR_CACHE:-$HOME/.cache/llama-crossbar}``."""
    root = os.environ.get("LLAMA_CROSSBAR_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "llama-crossbar"


def npm_unavailable(what: str, reason: str) -> NoReturn:
    """Skip because npm could not install ``what``; fail instead in CI (``CI`` set) or with
    ``REQUIRE_NPM_ENV`` set, where the agents must run."""
    for name in (REQUIRE_NPM_ENV, "CI"):
        if os.environ.get(name):
            pytest.fail(f"{reason} ({name} is set, so this is an error)", pytrace=False)
    pytest.skip(f"{what} could not be installed from npm: {reason}")


def private_dirs(home: Path) -> dict[str, str]:
    """HOME, the XDG dirs and TMPDIR, all inside ``home``: where a program run may write."""
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


@contextlib.contextmanager
def _locked(path: Path, timeout: float, unavailable: Callable[[str], NoReturn]) -> Iterator[None]:
    """One install at a time per cache entry; a bounded wait for another one."""
    with path.open("w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    unavailable(f"another install still holds {path} after {timeout:.0f} s")
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
    unavailable: Callable[[str], NoReturn],
) -> None:
    """Run npm; ``unavailable`` with its first error lines when it fails or does not end in
    time."""
    try:
        done = subprocess.run(
            args, capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        unavailable(f"{what} did not finish within {timeout:.0f} s")
    if done.returncode != 0:
        errors = done.stderr.decode(errors="replace").strip().splitlines()[:4]
        unavailable(f"{what} failed (exit {done.returncode}):\n" + "\n".join(errors))


def install_npm_package(
    package: str,
    version: str,
    ready: Callable[[Path], bool],
    *,
    entry: str,
    title: str | None = None,
    install_timeout: float = 600.0,
    allow_scripts: bool = False,
) -> Path:
    """The cache folder ``<entry>-<version>`` whose ``node_modules`` holds ``package`` at
    ``version``, installed first unless ``ready(folder)`` holds already. When npm cannot
    install it, the test is skipped with the reason, naming ``title`` (the package).

    It is built in a temporary folder next to that and published with one rename, under a
    lock, so an interrupted install never looks finished and parallel runs do not race.
    npm gets a HOME of its own (a postinstall may write there), a cache of its own and the
    user's ``.npmrc`` by name. The registry is asked once first, without retries, so that a
    machine without it skips in seconds (npm's own retries take more than a minute).
    """

    def unavailable(reason: str) -> NoReturn:
        npm_unavailable(f"{title or package} {version}", reason)

    root = npm_cache_root()
    dest = root / f"{entry}-{version}"
    if ready(dest):
        return dest
    npm = which("npm")
    if npm is None:
        unavailable("npm is not on PATH")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        unavailable(f"cannot make the cache folder {root}: {e}")
    with _locked(root / f".{entry}-{version}.lock", install_timeout + 60, unavailable):
        if ready(dest):  # installed while we waited
            return dest
        # Holding the lock, a build folder left here is from an install that was killed.
        for stale in root.glob(f".build-{entry}-{version}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".build-{entry}-{version}.", dir=root))
        try:
            env = dict(os.environ, **private_dirs(work / "home"))
            env["npm_config_cache"] = str(work / "npm-cache")
            if (Path.home() / ".npmrc").is_file():
                env["npm_config_userconfig"] = str(Path.home() / ".npmrc")
            quiet = ["--no-update-notifier", "--loglevel=error"]
            ask = [npm, "view", f"{package}@{version}", "version", *quiet]
            ask += ["--fetch-retries=0", "--fetch-timeout=30000"]
            what = f"asking the npm registry for {package}"
            _npm(ask, env, NPM_REGISTRY_TIMEOUT, what, unavailable)
            stage = work / "out"
            stage.mkdir()
            manifest: dict[str, object] = {"private": True, "dependencies": {package: version}}
            if allow_scripts:  # a postinstall that links a platform binary into place
                manifest["allowScripts"] = {package: True}
            (stage / "package.json").write_text(json.dumps(manifest, indent=2))
            install = [npm, "install", "--prefix", str(stage), "--no-audit", "--no-fund", *quiet]
            _npm(install, env, install_timeout, f"npm install {package}", unavailable)
            if not ready(stage):
                unavailable(f"npm installed {package}, but it does not work in {stage}")
            if dest.exists():  # a leftover that is not ready (checked above)
                dest.rename(work / "stale")
            stage.rename(dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if not ready(dest):
        unavailable(f"{package} does not work in {dest} after the install")
    return dest


def sandbox_env(home: Path) -> dict[str, str]:
    """Private dirs, and no network but 127.0.0.1 (proxies that refuse everything else)."""
    nowhere = f"http://127.0.0.1:{free_port()}"  # refused: nothing listens there
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        **private_dirs(home),
        "HTTP_PROXY": nowhere,
        "HTTPS_PROXY": nowhere,
        "ALL_PROXY": nowhere,
        "http_proxy": nowhere,
        "https_proxy": nowhere,
        "all_proxy": nowhere,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "npm_config_registry": f"{nowhere}/",
    }

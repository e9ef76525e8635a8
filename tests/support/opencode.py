"""OpenCode, installed from npm at a pinned version into a cache outside the repository,
and the environment and project settings it runs with against crossbar."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from tests.support.npm import install_npm_package, sandbox_env

OPENCODE_VERSION = "1.18.33"
"""The pinned ``opencode-ai`` on npm (its platform binary comes as an optional dependency,
``opencode-linux-x64``, linked into place by the package's postinstall)."""

MODEL = "qwen3-coder-30b"
"""The demo's default model of route ``opencode``, loaded on gpu-a."""

# Bounds of every wait here.
INSTALL_TIMEOUT = 600.0
VERSION_TIMEOUT = 30.0


def opencode_json(base_url: str, key: str | None = None) -> dict[str, object]:
    """The project's ``opencode.json``: the README's, with crossbar's address (and, given
    ``key``, the route's key, which OpenCode sends as ``Authorization: Bearer``)."""
    options = {"baseURL": base_url} | ({} if key is None else {"apiKey": key})
    return {
        "provider": {
            "lab": {
                "npm": "@ai-sdk/openai-compatible",
                "options": options,
                "models": {MODEL: {}},
            }
        }
    }


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

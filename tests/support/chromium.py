"""Headless Chromium, when installed, run on a page: its DOM as rendered on a phone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None
)


def chromium(url: str, profile: Path, *args: str) -> bytes:
    """Run headless Chromium on ``url`` with ``args``; its stdout (blocking: run it in a
    thread)."""
    assert CHROMIUM is not None
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
            url,
        ],
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    return result.stdout


def dump_dom(url: str, profile: Path) -> str:
    """The page as headless Chromium rendered it on a phone."""
    return chromium(url, profile, "--window-size=390,844", "--dump-dom").decode()

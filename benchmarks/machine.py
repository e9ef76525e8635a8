"""The machine and the crossbar source a ``run.py`` run measured, for its JSON result."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def source_digest(src: Path) -> str:
    """A short digest of the crossbar package's files, to tell working trees apart."""
    digest = hashlib.sha1()
    package = src / "crossbar"
    for path in sorted(package.rglob("*.py")):  # every subpackage too
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def interpreter(python: Path | None) -> dict[str, Any]:
    """The Python crossbar runs on: its version, and whether its interpreter calls into a
    shared ``libpython`` (pyenv's default build: 5-8% more CPU per request for crossbar than
    Debian's ``/usr/bin/python3``, measured side by side)."""
    script = (
        "import platform, sys; maps = open('/proc/self/maps').read();"
        " print(platform.python_version(), sys.executable, 'libpython' in maps, sep='|')"
    )
    version, executable, shared = (
        _first_line([str(python or sys.executable), "-c", script]) + "||"
    ).split("|")[:3]
    return {"version": version, "executable": executable, "shared_libpython": shared == "True"}


def machine(src: Path | None, python: Path | None = None) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    twisted = _first_line([sys.executable, "-c", "import twisted; print(twisted.__version__)"])
    commit = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = bool(_first_line(["git", "-C", str(REPO), "status", "--porcelain", "crossbar"]))
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "crossbar_python": interpreter(python),
        "twisted": twisted,
        "node": _first_line(["node", "--version"]),
        "wrk": _first_line(["wrk", "--version"]),
        "crossbar_commit": commit + ("-dirty" if dirty else "") if src is None else "-",
        "crossbar_source": str(src) if src else "this checkout",
        "crossbar_files_sha1": source_digest(src or REPO),
        "loadavg": os.getloadavg(),
    }

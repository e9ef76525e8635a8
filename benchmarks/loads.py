"""The load generators of ``run.py``: ``wrk`` and ``stream_client.js``, run and parsed.

``wrk`` POSTs a small chat completion (``post.lua``) and prints one ``WRK_JSON`` line;
``stream_client.js`` opens K concurrent SSE streams and prints one JSON line of figures.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_wrk(
    url: str, seconds: float, connections: int, threads_: int, key: str | None = None
) -> dict[str, Any]:
    cmd = ["wrk", f"-t{threads_}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s"]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    cmd += ["-s", str(HERE / "post.lua"), url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            result: dict[str, Any] = json.loads(line[len("WRK_JSON ") :])
            return result
    raise SystemExit(f"run.py: no result from wrk:\n{out}")


def run_streams(
    url: str,
    k: int,
    chunks: int,
    interval: float,
    duration: float = 0,
    ramp: float = 0,
    key: str | None = None,
) -> Any:
    cmd = ["node", str(HERE / "stream_client.js"), "--url", url]
    cmd += ["--streams", str(k), "--chunks", str(chunks), "--interval", f"{interval:g}"]
    if key:
        cmd += ["--key", key]
    if ramp:
        cmd += ["--ramp", f"{ramp:g}"]
    if duration:
        cmd += ["--duration", f"{duration:g}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def stream_load(spec: str) -> tuple[int, bool]:
    """``"500"``: 500 streams opened at once; ``"500s"``: staggered over one stream's length."""
    return int(spec.rstrip("s")), spec.endswith("s")

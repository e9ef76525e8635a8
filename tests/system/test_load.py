"""A bad crossbar.yaml stops a real ``twistd`` with one line naming the problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.configfiles import MINIMAL, write
from tests.support.twistdenv import ENV


def test_bad_config_stops_twistd_with_one_line(tmp_path: Path) -> None:
    """The user-facing contract: non-zero exit, last line names file, key, problem; no traceback."""
    path = write(tmp_path, MINIMAL.replace("[gpu-a, gpu-b]", "[gpu-a, gpu-x]"))
    twistd = Path(sys.executable).with_name("twistd")
    result = subprocess.run(
        [str(twistd), "-n", "--pidfile=", "crossbar", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=ENV,  # this checkout's twistd plugin
    )
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert "Traceback" not in output
    assert output.splitlines()[-1] == (
        f"crossbar: {path}: routes.opencode-a.hosts: item 1: unknown host 'gpu-x'"
    )

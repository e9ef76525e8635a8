"""A minimal crossbar.yaml, a writer of config files and a reader of the loader's error,
for the loader's tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from crossbar.config import ConfigError, load_config

MINIMAL = """\
listen: 7777                # a port, or a Twisted server endpoint string
poll_interval: 5s
hosts:
  gpu-a: http://10.0.0.11:8080
  gpu-b: http://10.0.0.12:8080/
routes:
  opencode-a:
    hosts: [gpu-a, gpu-b]
    default_model: qwen3-coder-30b
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "crossbar.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    return message[len(str(path)) + 2 :]

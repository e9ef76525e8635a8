"""crossbar.config.yamlfile: crossbar.yaml read from its file; every failure one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossbar.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("hosts:\n  a: http://h:1\n  a: http://h:2\nroutes: {}\n", "hosts.a: duplicate key"),
        ("hosts: {}\nroutes: [oops", "YAML syntax error"),
        ("hosts: 2024-13-01\n", "YAML value that cannot be read"),
    ],
)
def test_a_file_that_cannot_be_read_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "crossbar.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert said in str(info.value) and "\n" not in str(info.value)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nowhere.yaml")


def test_a_key_without_its_colon_is_reported_on_its_own_line(tmp_path: Path) -> None:
    """YAML finds the ``:`` missing where the next line begins; the admin's line is the key's."""
    path = tmp_path / "crossbar.yaml"
    path.write_text(
        "hosts:\n  gpu-a: http://h:8080\nroutes:\n  lab:\n    hosts: [gpu-a]\n"
        "    default_model qwen\n  other:\n    hosts: [gpu-a]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).endswith("YAML syntax error: line 6: could not find expected ':'")


def test_a_bad_value_is_reported_on_its_line(tmp_path: Path) -> None:
    path = tmp_path / "crossbar.yaml"
    path.write_text("hosts:\n  gpu-a: http://h:8080\nroutes:\n  lab:\n    hosts: [gpu-a]\n"
                    "    default_model: a: b\n")  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "line 6: mapping values are not allowed here" in str(info.value)

"""``usage_db`` and ``usage_retention`` in crossbar.yaml: their defaults, and a bad value
as one line naming the file, the key and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossbar.config import load_config, parse_config
from crossbar.demo import fleet_config
from tests.support.configfiles import MINIMAL, error_of, write


def test_by_default_usage_is_kept_beside_the_config_for_90_days(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    config = load_config(write(tmp_path, MINIMAL))
    assert config.usage_db == str(tmp_path / "crossbar-usage.sqlite3")
    assert config.usage_retention == 90 * 86400


def test_under_systemd_usage_is_kept_in_the_units_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit's config folder is read-only; ``StateDirectory=crossbar`` is writable, and
    systemd names it (the first, of several) in ``$STATE_DIRECTORY``."""
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/crossbar:/var/lib/other")
    config = load_config(write(tmp_path, MINIMAL))
    assert config.usage_db == "/var/lib/crossbar/crossbar-usage.sqlite3"
    written = load_config(write(tmp_path, MINIMAL + "usage_db: mine.db\n"))
    assert written.usage_db == str(tmp_path / "mine.db")  # what the admin wrote wins


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("off", None),
        ('"off"', None),
        ("false", None),
        ("usage.db", "{dir}/usage.db"),  # relative: to the config's folder
        ("/var/lib/crossbar/usage.db", "/var/lib/crossbar/usage.db"),
        ('":memory:"', ":memory:"),
    ],
)
def test_usage_db_names_a_file_or_is_off(tmp_path: Path, value: str, kept: str | None) -> None:
    config = load_config(write(tmp_path, MINIMAL + f"usage_db: {value}\n"))
    assert config.usage_db == (None if kept is None else kept.format(dir=tmp_path))


def test_a_config_with_no_file_and_the_demo_write_no_file() -> None:
    import yaml

    assert parse_config(yaml.safe_load(MINIMAL)).usage_db is None
    assert fleet_config("tcp:0", {"gpu-a": "http://h:1"}).usage_db == ":memory:"


@pytest.mark.parametrize(("value", "retention"), [("30d", 30 * 86400), ("36h", 36 * 3600)])
def test_usage_retention_is_a_duration(tmp_path: Path, value: str, retention: float) -> None:
    config = load_config(write(tmp_path, MINIMAL + f"usage_retention: {value}\n"))
    assert config.usage_retention == retention


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("usage_db: 5", "usage_db: must be a file's path or off, not int"),
        ("usage_db: ''", "usage_db: must be a file's path or off, not str"),
        ("usage_db: [a]", "usage_db: must be a file's path or off, not list"),
        ("usage_db: .", "usage_db: {dir} is a folder, not a file"),
        ("usage_db:", "usage_db: must be a file's path or off, not nothing"),
        ('usage_db: "a\\0b"', "usage_db: must not hold a NUL character"),
        ("usage_db: " + "x" * 5000, "usage_db: cannot be a file's path: [Errno 36] File name"),
        ("usage_db: ~no-such-user-here/u.db", "usage_db: cannot be a file's path: Could not"),
        ("usage_retention: 30m", "usage_retention: must be at least 1h, not '30m'"),
        ("usage_retention: soon", "usage_retention: not a duration: 'soon' (use e.g. 250ms"),
        ("usage_retention: 0", "usage_retention: must be more than zero, not 0"),
    ],
)
def test_a_bad_value_is_one_line(tmp_path: Path, line: str, message: str) -> None:
    assert error_of(tmp_path, MINIMAL + line + "\n").startswith(message.format(dir=tmp_path))


@pytest.mark.parametrize("value", ["off", "/var/lib/crossbar/u.sqlite3"])
def test_the_effective_config_shows_usage_as_it_loads(tmp_path: Path, value: str) -> None:
    """``--check --show``'s YAML loads back to the same keys (off written as false)."""
    from crossbar.config import effective
    from crossbar.config.show import to_yaml

    config = load_config(write(tmp_path, MINIMAL + f"usage_db: {value}\nusage_retention: 7d\n"))
    shown = effective(config)
    assert shown["usage_retention"] == 7 * 86400
    again = load_config(write(tmp_path, to_yaml(config)))
    assert (again.usage_db, again.usage_retention) == (config.usage_db, config.usage_retention)

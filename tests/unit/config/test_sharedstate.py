"""crossbar.config.sharedstate: ``shared_state`` is a redis:// URL, its password read
once (perhaps from the environment) and never shown."""

from __future__ import annotations

import pytest

from crossbar.config import ConfigError, parse_config, to_yaml
from crossbar.config.sharedstate import SharedState, parse_shared_state


def test_a_plain_url_names_host_port_and_database() -> None:
    assert parse_shared_state("redis://store.lab:6380/2") == SharedState("store.lab", 6380, 2)
    assert parse_shared_state("redis://10.0.0.5") == SharedState("10.0.0.5", 6379, 0)
    assert parse_shared_state("redis://[fd00::5]:7000/1") == SharedState("fd00::5", 7000, 1)


def test_a_password_is_kept_but_never_shown() -> None:
    state = parse_shared_state("redis://:s3cret-word@store:6379/0")
    assert state.password is not None and state.password.value == b"s3cret-word"
    assert "s3cret" not in repr(state) and "s3cret" not in state.shown
    assert state.shown == "redis://:****@store:6379/0"
    assert parse_shared_state("redis://ops:pw@[::1]/3").shown == "redis://ops:****@[::1]:6379/3"


def test_a_password_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORE_PASSWORD", "from-env")
    state = parse_shared_state("redis://:${STORE_PASSWORD}@store")
    assert state.password is not None and state.password.value == b"from-env"
    monkeypatch.delenv("STORE_PASSWORD")
    with pytest.raises(ValueError, match="environment variable STORE_PASSWORD is not set"):
        parse_shared_state("redis://:${STORE_PASSWORD}@store")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://store", "must be redis://HOST[:PORT][/DB] (rediss:// and"),
        ("rediss://store", "rediss:// and unix sockets are not supported"),
        ("redis://store:99999", "port must be 1-65535, not 99999"),
        ("redis://store/x", "must be redis://HOST[:PORT][/DB]"),
        (6379, "must be a redis:// URL, not int"),
    ],
)
def test_anything_else_is_refused_in_words(value: object, problem: str) -> None:
    with pytest.raises(ValueError, match=None) as refused:
        parse_shared_state(value)
    assert problem in str(refused.value)


def config(state: object) -> dict[str, object]:
    return {
        "shared_state": state,
        "hosts": {"gpu-a": "http://127.0.0.1:8080"},
        "routes": {"lab": {"hosts": ["gpu-a"]}},
    }


def test_the_config_carries_it_and_check_shows_it_masked() -> None:
    loaded = parse_config(config("redis://:hidden-pw@store:6379/4"))
    assert loaded.shared_state == SharedState("store", 6379, 4, loaded.shared_state.password)
    shown = to_yaml(loaded)
    assert "shared_state: redis://:****@store:6379/4" in shown and "hidden-pw" not in shown
    assert parse_config(config(None)).shared_state is None


def test_a_bad_url_stops_start_up_in_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config("redis://:pw@store:0/1x"), "lab.yaml")
    line = str(refused.value)
    assert line.startswith("lab.yaml: shared_state: ") and "\n" not in line
    assert "pw" not in line.split("shared_state: ", 1)[1].replace("password", "")

"""crossbar.config.model: the checked configuration's values, built directly (the loader's
checks are in tests/unit/config/test_load.py)."""

from __future__ import annotations

from typing import get_args

import attrs
import pytest

from crossbar.config.model import (
    POLICIES,
    WHEN_ALL_DOWN,
    Config,
    HostConfig,
    HostSettings,
    Policy,
    RouteConfig,
    WhenAllDown,
)

OWN = HostSettings(max_fails=3, idle_timeout=30.0)
DEFAULTS = HostSettings(poll_interval=2.0)


def make_config(defaults: HostSettings = DEFAULTS) -> Config:
    hosts = {
        "gpu-a": HostConfig("gpu-a", "http://10.0.0.1:8080", settings=OWN),
        "gpu-b": HostConfig("gpu-b", "https://gpu-b.lab/llama/"),
    }
    routes = {"chat": RouteConfig("chat", ("gpu-a", "gpu-b"), default_model=None)}
    return Config(listen="tcp:8080", hosts=hosts, routes=routes, defaults=defaults)


def test_settings_are_a_hosts_own_or_the_defaults() -> None:
    config = make_config()
    assert config.settings == {"gpu-a": OWN, "gpu-b": DEFAULTS}
    assert config.settings["gpu-b"] is config.defaults


def test_settings_are_resolved_once() -> None:
    config = make_config()
    assert config.settings is config.settings
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.settings = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        Config(listen="tcp:1", hosts={}, routes={}, settings={})  # type: ignore[call-arg]


def test_a_changed_copy_resolves_its_own_settings() -> None:
    other = HostSettings(recovery_polls=5)
    config = attrs.evolve(make_config(), defaults=other)
    assert config.settings == {"gpu-a": OWN, "gpu-b": other}


def test_settings_do_not_take_part_in_equality() -> None:
    assert make_config() == make_config()


def test_urls_maps_host_names_to_base_urls() -> None:
    assert make_config().urls == {
        "gpu-a": "http://10.0.0.1:8080",
        "gpu-b": "https://gpu-b.lab/llama",
    }


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("http://10.0.0.1:8080/", "http://10.0.0.1:8080"),
        ("http://10.0.0.1:8080", "http://10.0.0.1:8080"),
        ("https://gpu.lab/base/", "https://gpu.lab/base"),
        ("https://gpu.lab/base//", "https://gpu.lab/base"),
        ("https://gpu.lab/a/b", "https://gpu.lab/a/b"),
    ],
)
def test_host_url_loses_its_trailing_slash_and_keeps_its_path(url: str, kept: str) -> None:
    assert HostConfig("h", url).url == kept


def test_defaults() -> None:
    route = RouteConfig("chat", ("gpu-a",), default_model=None)
    assert (route.policy, route.when_all_down) == ("priority", "fail")
    config = Config(listen="tcp:8080", hosts={}, routes={})
    assert (config.defaults, config.source, config.workers) == (
        HostSettings(),
        "crossbar.yaml",
        1,
    )
    assert HostConfig("h", "http://h").settings is None


def test_policy_names_match_the_literal_types() -> None:
    assert (
        POLICIES == get_args(Policy) == ("priority", "round_robin", "least_busy", "cache_affinity")
    )
    assert WHEN_ALL_DOWN == get_args(WhenAllDown) == ("fail", "try_all")

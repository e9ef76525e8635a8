"""The effective config ``--check`` prints: every default filled in, keys masked, and
YAML that loads again to the same config."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml

from crossbar.config import ConfigError, HostSettings, Limits, load_config, to_yaml
from crossbar.config.load import _HOST_KEYS, _ROUTE_KEYS, _TOP_KEYS
from tests.support.certs import self_signed_ca

FULL = """\
listen: "tcp:7777:interface=127.0.0.1"
workers: 2
status_listen: 9101
status_keys: ["${STATUS_KEY}"]
api_keys: ["${LAB_KEY}", "${LAB_KEY_OLD}"]
trusted_proxies: [10.0.0.0/8, "::1"]
poll_interval: 2s
unhealthy_status: [503, 500]
unhealthy_latency: 1500ms
max_body: 1MiB
head_timeout: 10s
drain_timeout: 2m
hosts:
  gpu-a: http://10.0.0.11:8080/
  gpu-b:
    url: https://gpu-b.lab:8443/v1base
    api_key: "${HOST_KEY}"
    tls_ca: lab-ca.pem
    slots: 4
    max_fails: 3
    header_timeout: 30m
routes:
  coder:
    hosts: [gpu-a, gpu-b]
    default_model: qwen3-coder-30b
    policy: cache_affinity
    affinity_max_load: 2
    list_models: merged
    aliases: {"claude-haiku-*": qwen3-4b, "claude-*": qwen3-coder-30b}
  open:
    hosts: [gpu-b]
    when_all_down: try_all
    api_keys: []
"""

SECRETS = {
    "STATUS_KEY": "status-secret-1",
    "LAB_KEY": "lab-secret-2",
    "LAB_KEY_OLD": "lab-secret-3",
    "HOST_KEY": "host-secret-4",
}


@pytest.fixture
def full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "lab-ca.pem").write_bytes(self_signed_ca())
    path = tmp_path / "crossbar.yaml"
    path.write_text(FULL)
    return path


def test_what_is_shown_loads_again_to_the_same_config(full: Path) -> None:
    """With each masked key put back as the ${VARIABLE} it came from, the output is a
    config file that means exactly what the original meant."""
    config = load_config(full)
    shown = to_yaml(config).replace(" (****)", "")
    again = full.with_name("shown.yaml")
    again.write_text(shown)
    assert attrs.evolve(load_config(again), source=config.source) == config
    assert load_config(again).routes["coder"].api_keys[1].value == b"lab-secret-3"
    assert load_config(again).routes["coder"].aliases[0] == ("claude-haiku-*", "qwen3-4b")


def test_no_key_is_shown_only_where_it_came_from(full: Path) -> None:
    shown = to_yaml(load_config(full))
    for value in SECRETS.values():
        assert value not in shown
    data = yaml.safe_load(shown)
    assert data["status_keys"] == ["${STATUS_KEY} (****)"]
    assert data["hosts"]["gpu-b"]["api_key"] == "${HOST_KEY} (****)"
    # The top-level list, as the route that names none uses it; the route with [] is open.
    assert data["routes"]["coder"]["api_keys"] == ["${LAB_KEY} (****)", "${LAB_KEY_OLD} (****)"]
    assert data["routes"]["open"]["api_keys"] == []


def test_a_literal_key_is_masked_and_cannot_be_loaded_back_as_a_key(tmp_path: Path) -> None:
    """Pasting the output back must not make ``****`` a key that opens a route."""
    path = tmp_path / "crossbar.yaml"
    path.write_text(
        "api_keys: [sk-literal-77]\nhosts: {a: 'http://h'}\nroutes: {r: {hosts: [a]}}\n"
    )
    shown = to_yaml(load_config(path))
    assert "sk-literal-77" not in shown
    assert yaml.safe_load(shown)["routes"]["r"]["api_keys"] == ["literal (****)"]
    path.write_text(shown)
    with pytest.raises(ConfigError, match=r"routes\.r\.api_keys"):
        load_config(path)


def test_every_default_is_filled_in(tmp_path: Path) -> None:
    path = tmp_path / "crossbar.yaml"
    path.write_text(
        "poll_interval: 2s\nhosts:\n  a: http://10.0.0.1:8080\n"
        "  b: {url: 'http://h', max_fails: 3}\nroutes:\n  r: {hosts: [a, b]}\n"
    )
    data = yaml.safe_load(to_yaml(load_config(path)))
    # Every top-level key but api_keys, which each route shows as it uses it.
    assert set(data) == _TOP_KEYS - {"api_keys"}
    assert data["listen"] == "tcp:7777:backlog=1024"  # the default port and crossbar's backlog
    assert data["workers"] == 1 and data["status_listen"] is None
    assert data["drain_timeout"] == 30.0
    # Every limit; the limits' trusted_proxies are the top-level key's, shown as such.
    limits = attrs.asdict(Limits())
    assert limits.pop("trusted_proxies") == () and data["trusted_proxies"] == []
    assert {k: data[k] for k in limits} == limits
    assert data["max_connections_per_client"] == 512  # a quarter of max_connections
    assert data["header_timeout"] == HostSettings().header_timeout
    a, b = data["hosts"]["a"], data["hosts"]["b"]
    assert set(a) == _HOST_KEYS - {"api_key", "tls_ca", "slots"}  # none of them set
    assert (a["poll_interval"], a["max_fails"]) == (2.0, 1)  # the top-level settings
    assert (b["poll_interval"], b["max_fails"]) == (2.0, 3)  # and its own over them
    assert data["routes"]["r"] == {
        "hosts": ["a", "b"],
        "default_model": None,
        "policy": "priority",
        "when_all_down": "fail",
        "list_models": "forwarded",
        "api_keys": [],
        "queue": True,
        "max_waiting": 256,
        "max_waiting_per_key": None,
        "max_in_flight_per_key": None,
        "wait_timeout": 120.0,
        "spillover": False,
        "models": None,
        "min_idle_before_evict": 30.0,
        "aliases": None,
    }
    assert set(data["routes"]["r"]) == _ROUTE_KEYS - {"affinity_max_load", "home_wait"}  # c_a only

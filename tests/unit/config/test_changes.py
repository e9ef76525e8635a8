"""What a reload changes (crossbar.config.changes): two checked configs compared, the
keys a reload cannot apply kept as they were, and the one line an admin reads about it.

Configs are built from YAML-shaped dicts through the same checks as ``crossbar.yaml``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from crossbar.config import Config, parse_config
from crossbar.config.changes import FIXED, Changes, Reloads, compare
from tests.support.certs import self_signed_ca


def document(**top: Any) -> dict[str, Any]:
    """Two hosts and one route, with ``top`` replacing or adding top-level keys."""
    doc: dict[str, Any] = {
        "listen": 7777,
        "hosts": {"gpu-a": "http://10.0.0.11:8080", "gpu-b": "http://10.0.0.12:8080"},
        "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "qwen3"}},
    }
    doc.update(top)
    return doc


def parse(doc: dict[str, Any], base: Path | None = None) -> Config:
    return parse_config(copy.deepcopy(doc), "crossbar.yaml", base)


def changed(old: dict[str, Any], new: dict[str, Any], base: Path | None = None) -> Changes:
    return compare(parse(old, base), parse(new, base))


# -- no change ---------------------------------------------------------------------------------


def test_the_same_config_again_changes_nothing() -> None:
    doc = document(drain_timeout="10s", max_fails=2, api_keys=["sk-client-1"])
    new = parse(doc)
    changes = compare(parse(doc), new)
    assert changes.summary() == "nothing changed"
    assert changes.ignored == ()
    assert changes.config == new


# -- hosts -------------------------------------------------------------------------------------


def test_hosts_added_and_removed_are_named() -> None:
    old = document()
    new = document(
        hosts={"gpu-a": "http://10.0.0.11:8080", "gpu-c": "http://10.0.0.13:8080"},
        routes={"lab": {"hosts": ["gpu-a", "gpu-c"], "default_model": "qwen3"}},
    )
    changes = changed(old, new)
    assert (changes.added, changes.removed) == (("gpu-c",), ("gpu-b",))
    assert (changes.readdressed, changes.hosts_retuned) == ((), ())
    assert changes.routes_changed == ("lab",)
    assert changes.summary() != "nothing changed"
    assert changes.summary() == ("hosts added: gpu-c; hosts removed: gpu-b; routes changed: lab")


def test_a_host_under_its_old_name_at_a_new_url_is_readdressed_not_added() -> None:
    old = document()
    new = document(hosts={"gpu-a": "http://10.0.0.99:8080", "gpu-b": "http://10.0.0.12:8080"})
    changes = changed(old, new)
    assert changes.readdressed == ("gpu-a",)
    assert (changes.added, changes.removed, changes.hosts_retuned) == ((), (), ())
    assert changes.summary() == "hosts with a new address: gpu-a"


def test_a_host_with_a_new_ca_is_readdressed(tmp_path: Path) -> None:
    (tmp_path / "old-ca.pem").write_bytes(self_signed_ca("old lab CA"))
    (tmp_path / "new-ca.pem").write_bytes(self_signed_ca("new lab CA"))

    def with_ca(path: str) -> dict[str, Any]:
        hosts = {"gpu-a": {"url": "https://gpu-a.lab:8443", "tls_ca": path}, "gpu-b": "http://h"}
        return document(hosts=hosts)

    changes = changed(with_ca("old-ca.pem"), with_ca("new-ca.pem"), tmp_path)
    assert changes.readdressed == ("gpu-a",)
    assert changes.hosts_retuned == ()
    assert (
        changed(with_ca("old-ca.pem"), with_ca("old-ca.pem"), tmp_path).summary()
        == "nothing changed"
    )


@pytest.mark.parametrize(
    "host",
    [
        {"url": "http://10.0.0.11:8080", "max_fails": 3},
        {"url": "http://10.0.0.11:8080", "poll_interval": "1s"},
        {"url": "http://10.0.0.11:8080", "api_key": "sk-host-9"},
        {"url": "http://10.0.0.11:8080", "slots": 4},
    ],
    ids=["max_fails", "poll_interval", "api_key", "slots"],
)
def test_a_host_at_the_same_url_with_other_settings_is_retuned(host: dict[str, Any]) -> None:
    old = document()
    new = document(hosts={"gpu-a": host, "gpu-b": "http://10.0.0.12:8080"})
    changes = changed(old, new)
    assert changes.hosts_retuned == ("gpu-a",)
    assert (changes.added, changes.removed, changes.readdressed) == ((), (), ())
    assert changes.summary() == "hosts with new settings: gpu-a"
    assert changed(new, new).summary() == "nothing changed"  # the same settings again: nothing


def test_new_defaults_retune_every_host_that_uses_them() -> None:
    hosts = {
        "gpu-a": "http://10.0.0.11:8080",
        "gpu-b": "http://10.0.0.12:8080",
        "gpu-c": {"url": "http://10.0.0.13:8080", "max_fails": 5},  # sets it itself
    }
    routes = {"lab": {"hosts": ["gpu-a", "gpu-b", "gpu-c"]}}
    old = document(hosts=hosts, routes=routes)
    new = document(hosts=hosts, routes=routes, max_fails=3)
    changes = changed(old, new)
    assert changes.hosts_retuned == ("gpu-a", "gpu-b")
    assert changes.other == ("defaults",)
    assert changes.config.settings["gpu-a"].max_fails == 3
    assert changes.summary() == (
        "hosts with new settings: gpu-a, gpu-b; settings changed: defaults"
    )


@pytest.mark.parametrize(
    ("top", "name"),
    [
        ({"drain_timeout": "5s"}, "drain_timeout"),
        ({"max_body": "1MiB"}, "limits"),
        ({"status_keys": ["sk-status-1"]}, "status_keys"),
        ({"trusted_proxies": ["10.0.0.0/8"]}, "trusted_proxies"),
    ],
)
def test_other_top_level_keys_are_named_as_settings(top: dict[str, Any], name: str) -> None:
    changes = changed(document(), document(**top))
    assert changes.other == (name,)
    assert changes.hosts_retuned == ()
    assert changes.summary() == f"settings changed: {name}"


# -- routes ------------------------------------------------------------------------------------


def test_routes_added_and_removed_are_named() -> None:
    old = document(routes={"lab": {"hosts": ["gpu-a"]}, "old": {"hosts": ["gpu-b"]}})
    new = document(routes={"lab": {"hosts": ["gpu-a"]}, "new": {"hosts": ["gpu-a", "gpu-b"]}})
    changes = changed(old, new)
    assert (changes.routes_added, changes.routes_removed) == (("new",), ("old",))
    assert changes.routes_changed == ()
    assert (changes.added, changes.removed) == ((), ())
    assert changes.summary() == "routes added: new; routes removed: old"


@pytest.mark.parametrize(
    "route",
    [
        {"hosts": ["gpu-b", "gpu-a"], "default_model": "qwen3"},
        {"hosts": ["gpu-a", "gpu-b"], "default_model": "qwen3", "policy": "round_robin"},
        {"hosts": ["gpu-a", "gpu-b"], "default_model": "gpt-oss"},
        {"hosts": ["gpu-a", "gpu-b"], "default_model": "qwen3", "api_keys": ["sk-route-2"]},
        {"hosts": ["gpu-a"], "default_model": "qwen3"},
        {"hosts": ["gpu-a", "gpu-b"], "default_model": "qwen3", "aliases": {"claude-*": "q"}},
    ],
    ids=["hosts order", "policy", "default_model", "api_keys", "fewer hosts", "aliases"],
)
def test_a_route_changed_is_named(route: dict[str, Any]) -> None:
    changes = changed(document(), document(routes={"lab": route}))
    assert changes.routes_changed == ("lab",)
    assert (changes.routes_added, changes.routes_removed) == ((), ())
    assert changes.summary() == "routes changed: lab"


def test_top_level_api_keys_change_the_routes_that_use_them() -> None:
    routes = {"lab": {"hosts": ["gpu-a"]}, "own": {"hosts": ["gpu-b"], "api_keys": ["sk-own"]}}
    old = document(routes=routes, api_keys=["sk-client-1"])
    new = document(routes=routes, api_keys=["sk-client-2"])
    changes = changed(old, new)
    assert changes.routes_changed == ("lab",)  # "own" has its own keys
    assert changes.other == ()


# -- keys a reload cannot apply ----------------------------------------------------------------

FIXED_CHANGES = [
    (
        {},
        {"listen": "tcp:7778:interface=127.0.0.1"},
        "listen",
        "listen changed from tcp:7777 to tcp:7778:interface=127.0.0.1",
    ),
    ({}, {"workers": 2}, "workers", "workers changed from 1 to 2"),
    (
        {},
        {"listen_reuse_port": True},
        "listen_reuse_port",
        "listen_reuse_port changed from false to true",
    ),
    (
        {},
        {"status_listen": 9090},
        "status_listen",
        "status_listen changed from none to tcp:9090",
    ),
    (
        {"status_listen": 9090},
        {"status_listen": "tcp:9091:interface=127.0.0.1"},
        "status_listen",
        "status_listen changed from tcp:9090 to tcp:9091:interface=127.0.0.1",
    ),
    ({}, {"log_format": "json"}, "log_format", "log_format changed from text to json"),
    (
        {"usage_db": "off"},
        {"usage_db": "/var/lib/crossbar/usage.sqlite3"},
        "usage_db",
        "usage_db changed from none to /var/lib/crossbar/usage.sqlite3",
    ),
    (
        {},
        {"shared_state": "redis://:secret-pw@store:6379/1"},
        "shared_state",
        "shared_state changed from none to redis://:****@store:6379/1",
    ),
]


def test_the_fixed_keys_are_the_ones_tested() -> None:
    assert set(FIXED) == {key for _, _, key, _ in FIXED_CHANGES}


@pytest.mark.parametrize(
    ("before", "after", "key", "words"),
    FIXED_CHANGES,
    ids=[f"{key} {i}" for i, (_, _, key, _) in enumerate(FIXED_CHANGES)],
)
def test_a_fixed_key_changed_is_said_and_kept_while_the_rest_applies(
    before: dict[str, Any], after: dict[str, Any], key: str, words: str
) -> None:
    old = parse(document(**before))
    new = parse(document(drain_timeout="7s", **after))
    changes = compare(old, new)
    assert changes.ignored == (f"{words}: a reload cannot apply it, restart crossbar for that",)
    assert "backlog" not in changes.ignored[0]
    assert getattr(changes.config, key) == getattr(old, key)  # kept as it was
    assert getattr(new, key) != getattr(old, key)
    assert changes.config.drain_timeout == 7.0  # everything else is the new config's
    assert changes.other == ("drain_timeout",)
    assert key not in changes.summary()


def test_only_a_fixed_key_changed_applies_nothing_but_says_so() -> None:
    old = parse(document())
    changes = compare(old, parse(document(log_format="json")))
    assert changes.summary() == "nothing changed"
    assert len(changes.ignored) == 1
    assert changes.config == old


def test_several_fixed_keys_changed_give_one_sentence_each() -> None:
    old = parse(document())
    changes = compare(old, parse(document(listen=7778, workers=2, log_format="json")))
    assert [line.split(" ", 1)[0] for line in changes.ignored] == [
        "listen",
        "workers",
        "log_format",
    ]
    assert (changes.config.listen, changes.config.workers) == (old.listen, 1)
    assert changes.config.log_format == "text"


# -- secrets -----------------------------------------------------------------------------------


def test_no_key_is_ever_in_the_words() -> None:
    secrets = ["sk-secret-123", "sk-secret-456", "sk-host-secret-7", "sk-host-secret-8"]

    def doc(route_key: str, host_key: str, status_key: str) -> dict[str, Any]:
        return document(
            hosts={
                "gpu-a": {"url": "http://10.0.0.11:8080", "api_key": host_key},
                "gpu-b": "http://10.0.0.12:8080",
            },
            routes={"lab": {"hosts": ["gpu-a", "gpu-b"], "api_keys": [route_key]}},
            status_keys=[status_key],
        )

    old = doc(secrets[0], secrets[2], "sk-status-secret-1")
    new = doc(secrets[1], secrets[3], "sk-status-secret-2")
    new["listen"] = 7778  # so that there is an ignored sentence too
    changes = changed(old, new)
    assert changes.hosts_retuned == ("gpu-a",) and changes.routes_changed == ("lab",)
    words = " ".join((changes.summary(), *changes.ignored))
    for secret in [*secrets, "sk-status-secret-1", "sk-status-secret-2", "sk-"]:
        assert secret not in words


# -- the reload counters -----------------------------------------------------------------------


def test_reloads_start_with_the_load_time_and_no_reload() -> None:
    reloads = Reloads(loaded_at=100.0)
    assert reloads.to_json() == {
        "loaded_at": 100.0,
        "ok": 0,
        "refused": 0,
        "last_refused": None,
    }


def test_a_refused_reload_leaves_the_load_time_and_says_why() -> None:
    reloads = Reloads(loaded_at=100.0)
    reloads.failed(150.0, "crossbar.yaml: hosts: is missing")
    reloads.failed(160.0, "crossbar.yaml: routes.lab.hosts: item 0: unknown host 'x'")
    assert reloads.to_json() == {
        "loaded_at": 100.0,
        "ok": 0,
        "refused": 2,
        "last_refused": {
            "at": 160.0,
            "reason": "crossbar.yaml: routes.lab.hosts: item 0: unknown host 'x'",
        },
    }


def test_an_applied_reload_moves_the_load_time_and_clears_the_refusal() -> None:
    reloads = Reloads(loaded_at=100.0)
    reloads.failed(150.0, "bad")
    reloads.applied(200.0)
    assert reloads.to_json() == {"loaded_at": 200.0, "ok": 1, "refused": 1, "last_refused": None}
    reloads.applied(300.0)
    reloads.failed(310.0, "worse")
    assert reloads.loaded_at == 300.0
    assert reloads.to_json()["ok"] == 2
    assert reloads.last_refused == (310.0, "worse")

"""crossbar.config.fields: each key's parser turns what YAML gave into the checked value,
or says in words what is wrong with it."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from crossbar.config import ConfigError, parse_config
from crossbar.config.fields import (
    LISTEN_BACKLOG,
    parse_count,
    parse_duration,
    parse_flag,
    parse_health_path,
    parse_listen,
    parse_networks,
    parse_retention,
    parse_size,
    parse_statuses,
    parse_url,
    parse_usage_db,
    parse_workers,
    shown_listen,
    tcp_address,
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250ms", 0.25),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("90d", 90 * 86400.0),
        (" 1.5 s ", 1.5),
        (3, 3.0),
        (0.5, 0.5),
    ],
)
def test_a_duration_is_read_in_its_unit(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("5 minutes", "use e.g. 250ms"),
        (True, "not a duration"),
        (0, "more than zero"),
        ("-1s", "not a duration"),
        (10**400, "too long"),
        ([5], "not a duration"),
    ],
)
def test_a_bad_duration_is_refused_in_words(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_duration(value)


def test_retention_is_at_least_an_hour() -> None:
    assert parse_retention("90d") == 90 * 86400.0
    with pytest.raises(ValueError, match="at least 1h"):
        parse_retention("30m")


def test_a_url_loses_its_trailing_slash() -> None:
    assert parse_url("http://gpu-a:8081/") == "http://gpu-a:8081"
    assert parse_url("https://gpu-a/base/") == "https://gpu-a/base"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("ftp://gpu-a", r"must be http\(s\)://"),
        ("http://gpu-a/?x=1", "no query"),
        ("http://gpu-a:0", "1-65535"),
        (8081, "not int"),
        (None, "not nothing"),
        ("http://gpu-a:99999", "not a valid URL"),
    ],
)
def test_a_bad_url_is_refused_in_words(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_url(value)


def test_a_url_with_credentials_is_refused_without_repeating_the_password() -> None:
    with pytest.raises(ValueError, match="give the host an api_key") as refused:
        parse_url("http://admin:hunter2@gpu-a:8081")
    assert "hunter2" not in str(refused.value)


def test_the_health_path_is_one_that_does_not_load_a_model() -> None:
    assert parse_health_path("/health") == "/health"
    with pytest.raises(ValueError, match="makes a router load a model"):
        parse_health_path("/props/")
    with pytest.raises(ValueError, match="starting with /"):
        parse_health_path("health?x")


def test_counts_and_workers_are_whole_numbers_in_range() -> None:
    assert parse_count(3) == 3
    for bad in (0, True, 2.0, "3"):
        with pytest.raises(ValueError, match="whole number of at least 1"):
            parse_count(bad)
    assert parse_workers(64) == 64
    with pytest.raises(ValueError, match="at most 64"):
        parse_workers(65)


def test_statuses_are_http_codes() -> None:
    assert parse_statuses([500, 503]) == frozenset({500, 503})
    assert parse_statuses(None) == frozenset()
    with pytest.raises(ValueError, match="100-599"):
        parse_statuses([600])


@pytest.mark.parametrize(
    ("value", "size"),
    [(512, 512), ("512KiB", 512 * 1024), ("256MiB", 256 * 1024**2), ("1GB", 10**9), ("7", 7)],
)
def test_a_size_is_read_in_its_unit(value: object, size: int) -> None:
    assert parse_size(value) == size


def test_a_bad_size_is_refused() -> None:
    for bad, words in ((True, "not a size"), ("1TB", "use e.g. 512KiB"), (0, "more than zero")):
        with pytest.raises(ValueError, match=words):
            parse_size(bad)


def test_networks_are_addresses_or_blocks_and_the_bad_one_is_named_by_its_place() -> None:
    got = parse_networks(["10.0.0.0/8", "::1", " 192.168.1.7 "])
    assert got == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1"),
        ipaddress.ip_network("192.168.1.7"),
    )
    with pytest.raises(ValueError, match="item 1: not an address or CIDR block: 'lan'"):
        parse_networks(["10.0.0.0/8", "lan"])
    with pytest.raises(ValueError, match="must be a list"):
        parse_networks("10.0.0.0/8")


def test_the_usage_db_is_a_file_beside_the_config_memory_or_off(tmp_path: Path) -> None:
    assert parse_usage_db("usage.db", tmp_path) == str(tmp_path / "usage.db")
    assert parse_usage_db(":memory:", tmp_path) == ":memory:"
    assert parse_usage_db(False, tmp_path) is None
    assert parse_usage_db("off", tmp_path) is None
    with pytest.raises(ValueError, match="is a folder, not a file"):
        parse_usage_db(str(tmp_path), None)
    with pytest.raises(ValueError, match="NUL"):
        parse_usage_db("a\0b", None)


def test_a_flag_is_true_or_false_only() -> None:
    assert parse_flag(False) is False
    with pytest.raises(ValueError, match="true or false"):
        parse_flag("false")


def test_a_bare_port_listens_on_all_interfaces_with_a_large_backlog() -> None:
    assert parse_listen(8080) == f"tcp:8080:backlog={LISTEN_BACKLOG}"
    assert parse_listen("8080") == f"tcp:8080:backlog={LISTEN_BACKLOG}"
    assert parse_listen("tcp:8080:interface=127.0.0.1") == (
        f"tcp:8080:interface=127.0.0.1:backlog={LISTEN_BACKLOG}"
    )
    assert parse_listen("tcp:8080:backlog=10") == "tcp:8080:backlog=10"
    assert shown_listen(parse_listen(8080)) == "tcp:8080"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "1-65535"),
        (True, "not a port"),
        ("", "not a port"),
        ("tcp:8080:colour=red", "unknown option 'colour'"),
        ("carrier:pigeon", "unknown endpoint"),
        ("tcp:eighty", "a port must be a number"),
        ("tcp:70000", "1-65535"),
    ],
)
def test_a_bad_listen_is_refused_in_words(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_listen(value)


def test_workers_read_the_address_of_a_plain_tcp_listen() -> None:
    assert tcp_address("tcp:8080") == ("", 8080, LISTEN_BACKLOG)
    assert tcp_address(r"tcp:port=8080:interface=\:\:1:backlog=64") == ("::1", 8080, 64)
    with pytest.raises(ValueError, match="need a plain tcp: port"):
        tcp_address("unix:/tmp/crossbar.sock")
    with pytest.raises(ValueError, match="workers cannot use reuse"):
        tcp_address("tcp:8080:reuse=1")


@pytest.mark.parametrize(
    "url", ["http://gpu-a:8080/v1", "http://gpu-a:8080/v1/", "https://h/base/v1"]
)
def test_a_host_url_ending_in_v1_is_refused_with_the_url_to_use(url: str) -> None:
    """A client's base URL copied into the hosts: every poll would be a 404."""
    base = url.rstrip("/")[:-3]
    with pytest.raises(ValueError) as refused:
        parse_url(url)
    assert str(refused.value) == (
        f"host url must not end in /v1: crossbar adds the API path itself; use {base}"
    )


def test_a_host_url_ending_in_v1_is_one_line_naming_file_and_key() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"hosts": {"gpu-a": "http://gpu-a:8080/v1"}, "routes": {"r": ["gpu-a"]}})
    words = str(refused.value)
    assert len(words.splitlines()) == 1 and "crossbar.yaml" in words and "gpu-a" in words
    assert words.endswith("use http://gpu-a:8080")

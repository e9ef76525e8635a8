"""crossbar.queueing.flows: a flow, a pool's limit, and a refusal in words."""

from __future__ import annotations

import ipaddress

import pytest

from crossbar.config import ConfigError, KeyHolder, RouteConfig, Secret, parse_config
from crossbar.queueing import flow_of
from crossbar.queueing.flows import Flow, PoolLimit, Refused, client_group, refusal
from crossbar.queueing.queue import FairQueue, Waiting


def test_a_refusal_names_who_is_full_and_says_when_to_try_again() -> None:
    assert refusal("alice", 32, 7.2) == Refused(429, "alice: 32 requests already waiting", 8)
    assert refusal("lab", 0, 0.0) == Refused(429, "lab: every slot is busy, none may wait", 1)
    assert refusal("lab", 4, 1e9).retry_after == 300  # five minutes at most


@pytest.mark.parametrize(
    "wrong",
    [{"band": -1}, {"max_in_flight": 0}, {"max_waiting": -1}],
)
def test_a_flow_s_limits_are_checked(wrong: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Flow("alice", **wrong)
    assert Flow("alice", max_waiting=0).max_waiting == 0  # none may wait: allowed


def test_a_pool_limit_may_be_zero_never_negative() -> None:
    assert PoolLimit("lab", 0).max_waiting == 0
    with pytest.raises(ValueError):
        PoolLimit("lab", -1)


def test_an_unnamed_key_is_normal_and_waits_its_turn_behind_a_named_normal_key() -> None:
    unnamed = Secret(b"u" * 24)
    alice = Secret(b"a" * 24, holder=KeyHolder("alice"))
    carol = Secret(b"c" * 24, holder=KeyHolder("carol", "interactive"))
    route = RouteConfig("lab", ("gpu",), None, api_keys=(unnamed, alice, carol))
    q: FairQueue[str] = FairQueue()
    for key, item in ((alice, "alice"), (unnamed, "unnamed"), (carol, "carol")):
        assert isinstance(q.push("pool", flow_of(route, [], "10.0.0.1", key), item, 0.0), Waiting)

    # carol is interactive; alice queued before the unnamed key, both normal
    assert [q.pop(["pool"], 1.0).item for _ in range(3)] == ["carol", "alice", "unnamed"]  # type: ignore[union-attr]
    assert flow_of(route, [], "10.0.0.1", unnamed).band == Flow("x").band


def test_ipv6_clients_of_one_64_are_one_flow_as_they_share_one_connection_cap() -> None:
    open_route = RouteConfig("lab", ("gpu",), None)
    one = flow_of(open_route, [], "2001:db8:1:2::1")
    assert flow_of(open_route, [], "2001:db8:1:2:ffff::9") == one
    assert flow_of(open_route, [], "2001:db8:1:3::1") != one
    assert flow_of(open_route, [], "::ffff:10.0.0.5").name == "10.0.0.5"
    assert flow_of(open_route, [], "10.0.0.5").name == "10.0.0.5"
    assert flow_of(open_route, [], "unknown").name == "unknown"  # a UNIX socket's peer


PROXY = (ipaddress.ip_network("10.9.0.0/24"), ipaddress.ip_network("fd00::/64"))


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("10.9.0.2", [b"192.0.2.7"], "192.0.2.7"),  # one proxy: the address it saw
        ("10.9.0.2", [b"6.6.6.6, 192.0.2.7"], "192.0.2.7"),  # a client's own word: not taken
        ("10.9.0.2", [b"192.0.2.7, 10.9.0.3"], "192.0.2.7"),  # two proxies
        ("10.9.0.2", [b"6.6.6.6", b"192.0.2.7"], "192.0.2.7"),  # two header lines
        ("10.9.0.2", [b"2001:db8:1:2::5"], "2001:db8:1:2::/64"),
        ("10.9.0.2", [b"[2001:db8:1:2::5]:4711"], "2001:db8:1:2::/64"),
        ("10.9.0.2", [b"192.0.2.7:4711"], "192.0.2.7"),
        ("10.9.0.2", [b"not an address"], "10.9.0.2"),  # garbage: the proxy is all we know
        ("10.9.0.2", [], "10.9.0.2"),
        ("192.0.2.8", [b"6.6.6.6"], "192.0.2.8"),  # not a proxy: its word is not taken
        ("fd00::1", [b"192.0.2.7"], "192.0.2.7"),
    ],
)
def test_behind_a_trusted_proxy_the_flow_is_the_client_it_forwards(
    peer: str, forwarded: list[bytes], client: str
) -> None:
    open_route = RouteConfig("lab", ("gpu",), None)
    head = [(b"X-Forwarded-For", forwarded)] if forwarded else []
    assert flow_of(open_route, head, peer, None, PROXY).name == client
    assert flow_of(open_route, iter(head), peer, None, ()).name == client_group(peer)


def test_a_route_gives_keys_without_limits_of_their_own_its_per_key_limits() -> None:
    config = parse_config(
        {
            "hosts": {"gpu": "http://127.0.0.1:18081"},
            "api_keys": [
                "u" * 24,
                {"name": "alice", "key": "a" * 24},
                {"name": "bob", "key": "b" * 24, "max_in_flight": 8, "max_waiting": 1},
            ],
            "routes": {
                "lab": {"hosts": ["gpu"], "max_waiting_per_key": 4, "max_in_flight_per_key": 2},
                "open": {"hosts": ["gpu"]},
            },
        }
    )
    lab, other = config.routes["lab"], config.routes["open"]
    unnamed, alice, bob = (flow_of(lab, [], "", key) for key in lab.api_keys)
    assert (unnamed.max_in_flight, unnamed.max_waiting) == (2, 4)
    assert (alice.max_in_flight, alice.max_waiting) == (2, 4)
    assert (bob.max_in_flight, bob.max_waiting) == (8, 1)  # its own, over the route's
    assert flow_of(other, [], "", other.api_keys[0]).max_waiting is None  # none stated: none

    q: FairQueue[str] = FairQueue()
    for i in range(4):
        assert isinstance(q.push("pool", unnamed, str(i), 0.0), Waiting)
    assert q.push("pool", unnamed, "5th", 0.0) == Refused(
        429, f"{unnamed.name}: 4 requests already waiting", 1
    )


@pytest.mark.parametrize("key", ["max_waiting_per_key", "max_in_flight_per_key"])
@pytest.mark.parametrize("value", [0, -1, "many", True])
def test_a_route_s_per_key_limit_is_a_whole_number(key: str, value: object) -> None:
    spec = {"hosts": {"gpu": "http://127.0.0.1:18081"}, "routes": {"lab": {"hosts": ["gpu"]}}}
    spec["routes"]["lab"][key] = value  # type: ignore[index]
    with pytest.raises(ConfigError, match=f"routes.lab.{key}: must be a whole number"):
        parse_config(spec)

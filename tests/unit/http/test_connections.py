"""crossbar.http.connections: the caps on client connections. At the cap the oldest idle
connection gives way to a new one; with none idle, or past a client's share, the new one is
refused; and a flood of refusals is logged as one line of each kind every ten seconds."""

from __future__ import annotations

import ipaddress

import attrs
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.task import Clock

from crossbar.config import Limits
from crossbar.http.connections import LOGGED_EVERY, Connections, client_of
from crossbar.testing import LogCapture


@attrs.define(eq=False)
class Line:
    """A client connection as the caps see it."""

    name: str
    client: str | None = None
    idle: bool = False
    gave_way: bool = False

    def give_way(self) -> None:
        self.gave_way = True


def v4(host: str) -> IPv4Address:
    return IPv4Address("TCP", host, 40_000)


def connect(connections: Connections, name: str, host: str, limits: Limits) -> tuple[bool, Line]:
    line = Line(name)
    admitted, client = connections.admit(v4(host), limits)
    if admitted:
        connections.add(line, client)
    return admitted, line


def test_at_the_cap_the_oldest_idle_connection_gives_way() -> None:
    connections = Connections(Clock())
    limits = Limits(max_connections=3, max_connections_per_client=3)
    _, first = connect(connections, "first", "10.0.0.1", limits)
    _, second = connect(connections, "second", "10.0.0.2", limits)
    _, third = connect(connections, "third", "10.0.0.3", limits)
    connections.rest(second)
    connections.rest(first)  # idle after second: second is the oldest idle

    admitted, fourth = connect(connections, "fourth", "10.0.0.4", limits)

    assert admitted
    assert second.gave_way and not first.gave_way
    assert connections.open == {first, third, fourth}
    assert connections.closed_idle == {"max_connections": 1}


def test_at_the_cap_with_none_idle_the_new_one_is_refused() -> None:
    connections = Connections(Clock())
    limits = Limits(max_connections=2, max_connections_per_client=2)
    _, first = connect(connections, "first", "10.0.0.1", limits)
    connect(connections, "second", "10.0.0.2", limits)
    connections.rest(first)
    connections.busy(first)  # began another request: it no longer gives way

    admitted, _ = connect(connections, "third", "10.0.0.3", limits)

    assert not admitted
    assert not first.gave_way
    assert connections.refused == 1


def test_one_client_past_its_share_is_refused_while_others_still_connect() -> None:
    connections = Connections(Clock())
    limits = Limits(max_connections=10, max_connections_per_client=2)
    connect(connections, "a1", "10.0.0.1", limits)
    connect(connections, "a2", "10.0.0.1", limits)

    assert connect(connections, "a3", "10.0.0.1", limits)[0] is False
    assert connect(connections, "b1", "10.0.0.2", limits)[0] is True


def test_past_its_share_a_clients_own_idle_connection_gives_way_not_anothers() -> None:
    connections = Connections(Clock())
    limits = Limits(max_connections=10, max_connections_per_client=2)
    _, other = connect(connections, "b1", "10.0.0.2", limits)
    connections.rest(other)
    _, a1 = connect(connections, "a1", "10.0.0.1", limits)
    connect(connections, "a2", "10.0.0.1", limits)
    connections.rest(a1)

    assert connect(connections, "a3", "10.0.0.1", limits)[0] is True
    assert a1.gave_way and not other.gave_way


def test_a_closed_connection_frees_its_place_and_its_share() -> None:
    connections = Connections(Clock())
    limits = Limits(max_connections=1, max_connections_per_client=1)
    _, first = connect(connections, "first", "10.0.0.1", limits)
    connections.forget(first)
    connections.forget(first)  # closing twice counts once

    assert connect(connections, "again", "10.0.0.1", limits)[0] is True
    assert connections.refused == 0


def test_a_flood_of_refusals_is_one_line_every_ten_seconds() -> None:
    clock = Clock()
    connections = Connections(clock)
    limits = Limits(max_connections=1, max_connections_per_client=1)
    connect(connections, "held", "10.0.0.1", limits)
    capture = LogCapture()
    try:
        for i in range(500):
            connect(connections, f"flood{i}", "10.0.0.1", limits)
        connect(connections, "other", "10.0.0.2", limits)
        first = list(capture.lines)
        clock.advance(LOGGED_EVERY)
        second = list(capture.lines)
        clock.advance(LOGGED_EVERY)
    finally:
        capture.close()
        connections.stop()

    assert first == [
        "refused 1 client connection from 10.0.0.1: 1 open from each, the"
        " max_connections_per_client limit"
    ]
    assert second[1:] == [
        "refused 1 client connection: 1 open, the max_connections limit",
        "refused 499 client connections from 10.0.0.1: 1 open from each, the"
        " max_connections_per_client limit",
    ]
    assert capture.lines == second  # nothing new to say: no line, no timer
    assert not clock.getDelayedCalls()
    assert connections.refused == 501


def test_the_client_is_the_address_an_ipv6_machines_64_or_none_behind_a_proxy() -> None:
    proxies = (ipaddress.ip_network("10.9.0.0/16"),)
    assert client_of(v4("10.0.0.1"), ()) == "10.0.0.1"
    assert client_of(v4("10.9.1.1"), proxies) is None
    assert client_of(IPv6Address("TCP", "2001:db8:1:2:3:4:5:6", 1), ()) == "2001:db8:1:2::/64"
    assert client_of(IPv6Address("TCP", "::ffff:10.0.0.7", 1), ()) == "10.0.0.7"
    assert client_of(IPv6Address("TCP", "fe80::1%eth0", 1), ()) == "fe80::/64"
    assert client_of(UNIXAddress(b"/run/crossbar.sock"), ()) is None
    assert client_of(None, ()) is None

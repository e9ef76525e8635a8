"""crossbar.sites: the sites clients come in through, their keys and limits (taken
again on a reload), and their refusals handed to the same observer as the proxy's."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web.resource import Resource

from crossbar.config import Config, parse_config
from crossbar.sites import PageResources, Sites
from crossbar.stats.record import RequestRecord

PEER = IPv4Address("TCP", "127.0.0.1", 40000)


class Seen:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def request_done(self, record: RequestRecord) -> None:
        self.records.append(record)


def config(**top: Any) -> Config:
    return parse_config(
        {
            "listen": "tcp:7777:interface=127.0.0.1",
            "hosts": {"gpu-a": "http://127.0.0.1:18081"},
            "routes": {"lab": {"hosts": ["gpu-a"]}},
            **top,
        }
    )


def door(cfg: Config, seen: Seen) -> Sites:
    pages = PageResources(Resource(), Resource(), Resource())
    return Sites(cfg, MemoryReactorClock(), Resource(), pages, seen)


def send(front: Sites, site_index: int, data: bytes) -> bytes:
    channel = front.sites[site_index].buildProtocol(PEER)
    transport = StringTransport(peerAddress=PEER)
    channel.makeConnection(transport)
    channel.dataReceived(data)
    return transport.value()


def test_the_pages_get_a_site_of_their_own_only_with_status_listen() -> None:
    seen = Seen()
    assert len(door(config(), seen).sites) == 1
    own = door(config(status_listen="tcp:7778:interface=127.0.0.1"), seen)
    assert len(own.sites) == 2 and own.status_listener is not None


def test_a_request_refused_at_the_door_reaches_the_observer() -> None:
    seen = Seen()
    front = door(config(api_keys=["k" * 24]), seen)
    answer = send(front, 0, b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: a\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401")
    [record] = seen.records
    assert (record.status, record.refused, record.path) == (401, True, b"/lab/v1/chat/completions")


def test_a_reload_gives_every_site_its_keys_and_limits_only_once_applied() -> None:
    seen = Seen()
    front = door(config(status_listen="tcp:7778:interface=127.0.0.1"), seen)
    request = b"GET /lab/v1/models HTTP/1.1\r\nHost: a\r\n\r\n"
    reloaded = config(
        status_listen="tcp:7778:interface=127.0.0.1",
        api_keys=["k" * 24],
        max_connections=7,
    )
    apply = front.prepare(reloaded)
    assert not send(front, 0, request).startswith(b"HTTP/1.1 401")  # not yet applied
    apply()
    assert send(front, 0, request).startswith(b"HTTP/1.1 401")
    assert {site.limits.max_connections for site in front.sites} == {7}

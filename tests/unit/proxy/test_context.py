"""crossbar.proxy.context: what every exchange works with, made once by the composition
root, with what is read on every request kept at hand."""

from __future__ import annotations

from twisted.internet.task import Clock

from crossbar.config import parse_config
from crossbar.polling import HealthTable
from crossbar.proxy.context import ProxyContext
from crossbar.queueing import Traffic
from crossbar.upstream import Upstreams

CONFIG = parse_config(
    {
        "hosts": {
            "gpu-a": {"url": "http://127.0.0.1:18081", "api_key": "host-key"},
            "gpu-b": {"url": "http://127.0.0.1:18082", "header_timeout": "7s"},
        },
        "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"]}},
    }
)


class Records:
    def request_done(self, record: object) -> None:
        pass


def context() -> ProxyContext:
    clock = Clock()
    table = HealthTable(CONFIG.urls, clock, CONFIG.settings)
    traffic = Traffic(CONFIG.hosts, CONFIG.routes)
    upstreams = Upstreams(clock, CONFIG.urls, {}, clock=clock)
    return ProxyContext(CONFIG, table, traffic, upstreams, clock, Records())


def test_each_host_s_own_settings_are_at_hand() -> None:
    made = context()
    assert made.settings["gpu-b"].header_timeout == 7.0
    assert made.settings["gpu-a"].header_timeout == CONFIG.settings["gpu-a"].header_timeout


def test_only_a_host_with_a_key_gets_an_authorization_line() -> None:
    made = context()
    assert made.host_keys == {"gpu-a": b"Authorization: Bearer host-key\r\n"}


def test_without_a_queue_every_request_is_sent_on_at_once() -> None:
    assert context().waits is None

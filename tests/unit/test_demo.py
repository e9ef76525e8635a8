"""crossbar.demo: ``--demo`` starts three simulated routers on loopback and a config that
routes to them by model, written nowhere. In memory: the hosts listen on a memory reactor."""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import MemoryReactorClock

from crossbar.config import DEMO_SOURCE, MEMORY_DB
from crossbar.demo import FLEET, demo_config, fleet_config


class PortsReactor(MemoryReactorClock):
    """A memory reactor that gives each listener its own port, as the system would."""

    def __init__(self) -> None:
        super().__init__()
        self.next_port = 20_000

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        if port == 0:
            self.next_port += 1
            port = self.next_port
        return super().listenTCP(port, factory, backlog, interface)


def test_the_demo_starts_three_loopback_hosts_and_routes_to_them() -> None:
    reactor = PortsReactor()
    config, hosts = demo_config(reactor, "tcp:8080")

    assert len(hosts) == 3
    assert [(server[0], server[3]) for server in reactor.tcpServers] == [
        (20_001, "127.0.0.1"),
        (20_002, "127.0.0.1"),
        (20_003, "127.0.0.1"),
    ]
    assert {name: host.url for name, host in config.hosts.items()} == {
        "gpu-a": "http://127.0.0.1:20001",
        "gpu-b": "http://127.0.0.1:20002",
        "gpu-c": "http://127.0.0.1:20003",
    }
    assert [host.models for host in hosts] == list(FLEET.values())
    assert config.listen == "tcp:8080"


def test_each_routes_model_is_loaded_on_its_first_host() -> None:
    config = fleet_config(
        "tcp:8080", {name: f"http://127.0.0.1:{i}" for i, name in enumerate(FLEET, 1)}
    )

    assert set(config.routes) == {"opencode", "hermes"}
    for route in config.routes.values():
        assert FLEET[route.hosts[0]][route.default_model] == "loaded"  # type: ignore[index]
        assert route.list_models == "merged"


def test_the_demo_writes_no_usage_and_says_it_is_the_demo() -> None:
    config = fleet_config("tcp:8080", {name: "http://127.0.0.1:1" for name in FLEET})
    assert config.usage_db == MEMORY_DB
    assert config.source == DEMO_SOURCE

"""crossbar.pages.app: the Klein app of ``/_crossbar/`` in memory (StubTreq, a Clock, a
health table driven by hand): the probes a balancer reads, a host's own status, the metrics,
and a reload asked over HTTP. The page and the whole app over sockets are in
tests/system/test_status.py."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import treq
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from crossbar.config import Config, Reloaded, parse_config
from crossbar.pages.app import StatusApp
from crossbar.polling import HealthTable
from crossbar.queueing import Traffic
from crossbar.stats import Metrics, RecentTraffic

T0 = 1_700_000_000.0


def result(d: Deferred[Any]) -> Any:
    got: list[Any] = []
    d.addBoth(got.append)
    assert got, "the app did not answer"
    if hasattr(got[0], "raiseException"):
        got[0].raiseException()
    return got[0]


@attrs.define
class Pages:
    app: StatusApp
    table: HealthTable
    traffic: Traffic
    clock: Clock
    reloads: list[str] = attrs.Factory(list)

    def ask(self, path: str, method: str = "GET") -> tuple[int, dict[str, list[str]], bytes]:
        http = StubTreq(self.app.resource())
        response = result(http.request(method, "http://crossbar" + path))
        body = result(treq.content(response))
        headers = {
            name.decode().lower(): [v.decode() for v in values]
            for name, values in response.headers.getAllRawHeaders()
        }
        return response.code, headers, body

    def json(self, path: str, method: str = "GET") -> tuple[int, Any]:
        code, headers, body = self.ask(path, method)
        assert headers["content-type"] == ["application/json"]
        assert headers["cache-control"] == ["no-store"]
        return code, json.loads(body)


def lab(**settings: Any) -> Config:
    return parse_config(
        {
            "hosts": {"gpu-a": "http://10.0.0.1:8080", "gpu-b": "http://10.0.0.2:8080"},
            "routes": {"lab": {"hosts": ["gpu-a"]}, "bee": {"hosts": ["gpu-b"]}},
            **settings,
        }
    )


def pages(config: Config | None = None, **options: Any) -> Pages:
    config = config or lab()
    clock = Clock()
    clock.advance(T0)
    table = HealthTable(config.urls, clock, config.settings)
    traffic = Traffic(config.hosts, config.routes)
    app = StatusApp(
        config,
        table,
        traffic,
        Metrics(table, traffic),
        clock,
        recent=RecentTraffic(config.hosts, clock),
        **options,
    )
    return Pages(app, table, traffic, clock)


def test_livez_says_live_whatever_the_hosts_do() -> None:
    assert pages().json("/livez") == (200, {"live": True})


def test_readyz_names_the_routes_without_a_healthy_host() -> None:
    p = pages()
    assert p.json("/readyz") == (503, {"ready": False, "routes_down": ["lab", "bee"]})
    p.table.record_ok("gpu-a", loaded=["m"], known=["m"])
    assert p.json("/readyz") == (503, {"ready": False, "routes_down": ["bee"]})
    p.table.record_ok("gpu-b", loaded=["m"], known=["m"])
    assert p.json("/readyz") == (200, {"ready": True, "routes_down": []})


def test_a_draining_crossbar_is_not_ready_so_a_balancer_sends_elsewhere() -> None:
    p = pages()
    for host in ("gpu-a", "gpu-b"):
        p.table.record_ok(host, loaded=["m"], known=["m"])
    p.app.draining = True
    assert p.json("/readyz") == (503, {"ready": False, "draining": True, "routes_down": []})


def test_a_hosts_status_counts_its_requests_in_flight() -> None:
    p = pages()
    p.table.record_ok("gpu-a", loaded=["m"], known=["m", "n"])
    p.traffic.in_flight["gpu-a"] = 3
    code, doc = p.json("/status/gpu-a")

    assert code == 200
    assert doc["url"] == "http://10.0.0.1:8080"
    assert doc["healthy"] is True
    assert doc["in_flight"] == 3
    assert doc["loaded"] == ["m"]
    assert doc["last_ok"] == "2023-11-14T22:13:20.000Z"
    assert doc["leaving"] is False
    assert p.json("/status/gpu-x") == (404, {"error": "unknown host"})


def test_status_names_each_routes_choice_and_base_url() -> None:
    p = pages()
    p.table.record_ok("gpu-a", loaded=["m"], known=["m"])
    p.clock.advance(12.5)
    code, doc = p.json("/status")

    assert code == 200
    assert doc["uptime_seconds"] == 12.5
    assert doc["routes"]["lab"]["choice"] == "gpu-a"
    assert doc["routes"]["lab"]["base_url"] == "http://crossbar/lab/v1"
    assert doc["routes"]["bee"]["choice"] is None  # its one host was never polled


def test_metrics_are_this_workers_or_gathered_from_all() -> None:
    gathered = b"# every worker's metrics\n"
    p = pages(gather_metrics=lambda: succeed(gathered))

    code, headers, body = p.ask("/metrics")
    assert code == 200
    assert headers["content-type"][0].startswith("text/plain; version=")
    assert headers["cache-control"] == ["no-store"]
    assert body == gathered
    code, _, local = p.ask("/metrics?local=1")  # what worker 0 asks each worker
    assert b"crossbar_host_up" in local
    assert b"every worker" not in local


def test_a_reload_over_http_needs_a_file_and_an_admins_pages() -> None:
    asked: list[str] = []

    def reload() -> Reloaded:
        asked.append("reload")
        return Reloaded(True, "reloaded lab.yaml: nothing changed")

    assert pages().json("/reload", "POST") == (409, {"error": "no config file to reload"})
    open_pages = pages(reload=reload)
    assert open_pages.json("/reload", "POST") == (
        403,
        {"error": "reload over HTTP needs status_keys or status_listen"},
    )
    assert asked == []


def test_a_reload_says_what_changed_or_why_it_was_refused() -> None:
    answers = [
        Reloaded(True, "reloaded lab.yaml: gpu-c added", ignored=("listen: needs a restart",)),
        Reloaded(False, "reload refused: routes.lab.hosts: names unknown host gpu-x"),
        Reloaded(False, "reload refused: crossbar is stopping", conflict=True),
    ]
    p = pages(lab(status_listen=9090), reload=lambda: answers.pop(0))

    assert p.json("/reload", "POST") == (
        200,
        {
            "reloaded": True,
            "changes": "reloaded lab.yaml: gpu-c added",
            "ignored": ["listen: needs a restart"],
        },
    )
    assert p.json("/reload", "POST") == (
        400,
        {
            "error": "reload refused",
            "reason": "reload refused: routes.lab.hosts: names unknown host gpu-x",
        },
    )
    assert p.json("/reload", "POST")[0] == 409


@pytest.mark.parametrize(
    ("path", "method", "allow"), [("/reload", "GET", "POST"), ("/status", "DELETE", "GET, HEAD")]
)
def test_a_wrong_method_is_refused_in_json_naming_the_right_ones(
    path: str, method: str, allow: str
) -> None:
    code, headers, body = pages().ask(path, method)
    assert code == 405
    assert headers["allow"] == [allow]
    assert json.loads(body) == {"error": "method not allowed"}


def test_an_unknown_page_is_a_json_404() -> None:
    assert pages().json("/nope") == (404, {"error": "not found"})

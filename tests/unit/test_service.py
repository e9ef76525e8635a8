"""crossbar.service in memory: the start-up lines (each route's base URL, which routes want
keys, where the pages are) and the slots cache affinity counts. The daemon run for real is
in ``tests/system/test_service.py``.
"""

from __future__ import annotations

import pytest

from crossbar.config import parse_config
from crossbar.service import announcement


@pytest.mark.parametrize(
    ("listen", "port", "base"),
    [
        ("tcp:7777:backlog=1024", 7777, "http://gpu-box:7777"),
        ("tcp:7777:interface=10.1.2.3:backlog=1024", 7777, "http://10.1.2.3:7777"),
        ("unix:/run/crossbar.sock", None, "unix:/run/crossbar.sock"),
    ],
)
def test_the_start_up_lines_give_each_route_s_base_url(
    listen: str, port: int | None, base: str
) -> None:
    config = parse_config(
        {
            "listen": listen,
            "hosts": {"gpu-a": "http://10.0.0.1:8080", "gpu-b": "http://10.0.0.2:8080"},
            "routes": {
                "lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m1", "policy": "least_busy"},
                "spare": {"hosts": ["gpu-b"]},
            },
        }
    )
    assert announcement(config, port, "gpu-box") == [
        f"crossbar 0.1.0 listening on {listen.replace(':backlog=1024', '')}",
        f"route lab: {base}/lab/v1 -> hosts gpu-a, gpu-b; policy least_busy; default model m1",
        f"route spare: {base}/spare/v1 -> hosts gpu-b; policy priority; default model none",
        f"status pages: {base}/_crossbar/",
    ]


def test_the_start_up_lines_say_which_routes_want_keys_and_where_the_pages_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENCODE_KEY", "oc-secret-1")
    config = parse_config(
        {
            "listen": 7777,
            "status_listen": "tcp:9101:interface=127.0.0.1",
            "status_keys": ["st-secret-2"],
            "hosts": {"gpu-a": {"url": "http://10.0.0.1:8080", "api_key": "host-secret-3"}},
            "routes": {
                "lab": {"hosts": ["gpu-a"], "api_keys": ["${OPENCODE_KEY}"]},
                "open": {"hosts": ["gpu-a"]},
            },
        }
    )
    lines = announcement(config, 7777, "gpu-box", 9101)
    assert lines == [
        "crossbar 0.1.0 listening on tcp:7777",
        "route lab: http://gpu-box:7777/lab/v1 -> hosts gpu-a; policy priority; "
        "default model none; a key is required",
        "route open: http://gpu-box:7777/open/v1 -> hosts gpu-a; policy priority; "
        "default model none",
        "status pages: http://127.0.0.1:9101/_crossbar/ (the main port serves only "
        "/_crossbar/livez and /_crossbar/readyz); a status key is required "
        "(Authorization: Bearer <key>)",
    ]
    assert not any("secret" in line for line in lines)


def test_cache_affinity_counts_the_slots_a_host_said_it_has() -> None:
    """Without ``slots:`` in the config, what the poller learned of a host's loaded model
    (its ``total_slots``) is what ``cache_affinity`` keeps its conversations within."""
    from twisted.internet.task import Clock

    from crossbar.config import parse_config
    from crossbar.hosts import Hosts
    from crossbar.routing.policies import CacheAffinity

    config = parse_config(
        {
            "hosts": {
                "gpu-a": "http://127.0.0.1:18081",
                "gpu-b": {"url": "http://127.0.0.1:18082", "slots": 2},
            },
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "policy": "cache_affinity"}},
        }
    )
    hosts = Hosts(config, Clock())
    policy = hosts.traffic.policies.named("cache_affinity")
    assert isinstance(policy, CacheAffinity)
    assert policy.conversations.slots == {"gpu-b": 2}
    hosts.table.record_ok("gpu-a", ["m"], ["m"])
    hosts.table.record_slots("gpu-a", "m", 4)
    assert policy.conversations.slots == {"gpu-a": 4, "gpu-b": 2}
    hosts.table.record_ok("gpu-b", ["m"], ["m"])
    hosts.table.record_slots("gpu-b", "m", 8)  # the config's word wins
    assert policy.conversations.slots == {"gpu-a": 4, "gpu-b": 2}

"""Replicas sharing a store (``shared_state``) agree on every conversation's host: each tells
the others where it placed each turn. Three simulated hosts of one slot each (learned from
their ``/props``, not configured), more conversations than slots, each conversation's turns
alternating between two real crossbar processes, as a load balancer without key hashing
sends them."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.testing import SimulatedHost
from tests.support import Daemon, start_daemon
from tests.support.affinity import body
from tests.support.processes import fetch, replicas, wait_until
from tests.support.redis import running_redis

HOSTS = ("gpu-a", "gpu-b", "gpu-c")
CONVERSATIONS = 8
TURNS = 4


def replica_config(urls: dict[str, str], store_url: str) -> str:
    hosts = "".join(f"  {name}:\n    url: {url}\n" for name, url in urls.items())
    return (
        f"shared_state: {store_url}\npoll_interval: 200ms\nhosts:\n{hosts}"
        f"routes:\n  lab:\n    hosts: [{', '.join(urls)}]\n    default_model: tiny-a\n"
        "    policy: cache_affinity\n    wait_timeout: 60s\n"
    )


def ready(daemon: Daemon) -> bool:
    """Joined the store, and each host's one slot learned."""
    if "crossbar_shared_count_up 1.0" not in fetch(daemon.url + "/_crossbar/metrics").decode():
        return False
    hosts = json.loads(fetch(daemon.url + "/_crossbar/status"))["hosts"]
    return all(host.get("slots") == {"tiny-a": 1} for host in hosts.values())


def turn(daemon: Daemon, first: str, n: int) -> str:
    """Turn ``n`` of the conversation that began with ``first``: the host that answered."""
    request = urllib.request.Request(
        daemon.url + "/lab/v1/chat/completions",
        data=json.dumps(body(first, n)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
        return str(response.headers["x-crossbar-host"])


def two_replicas(tmp_path: Path, urls: dict[str, str], store_url: str) -> Any:
    config = replica_config(urls, store_url)
    return replicas(tmp_path, config, ready, "each replica to join and learn the slots")


def alternate(tmp_path: Path, urls: dict[str, str], store_url: str) -> dict[str, Any]:
    """Every conversation's first turn, then every second one..., each turn through the
    other replica than the turn before: the hosts each conversation's turns went to."""
    firsts = [f"task {n}" for n in range(CONVERSATIONS)]
    with two_replicas(tmp_path, urls, store_url) as both:
        went: list[list[str]] = [[] for _ in firsts]
        for n in range(1, TURNS + 1):
            for index, first in enumerate(firsts):
                went[index].append(turn(both[(index + n) % 2], first, n))
        return {"went": went, "output": "".join(r.output() for r in both)}


def workers_alternate(tmp_path: Path, urls: dict[str, str]) -> dict[str, Any]:
    """The same through one crossbar of two workers, each turn on a new connection (which
    the kernel gives either worker)."""
    text = replica_config(urls, "").replace("shared_state: \n", "workers: 2\n")
    daemon = start_daemon(tmp_path, text)
    try:
        wait_until(lambda: ready_workers(daemon), "both workers to share and learn the slots")
        firsts = [f"task {n}" for n in range(CONVERSATIONS)]
        went: list[list[str]] = [[] for _ in firsts]
        for n in range(1, TURNS + 1):
            for index, first in enumerate(firsts):
                went[index].append(turn(daemon, first, n))
        return {"went": went, "output": daemon.output()}
    finally:
        daemon.stop()


def ready_workers(daemon: Daemon) -> bool:
    metrics = fetch(daemon.url + "/_crossbar/metrics").decode()
    if not all(f'crossbar_shared_count_up{{worker="{w}"}} 1.0' in metrics for w in "01"):
        return False
    hosts = json.loads(fetch(daemon.url + "/_crossbar/status"))["hosts"]
    return all(host.get("slots") == {"tiny-a": 1} for host in hosts.values())


@pytest_twisted.ensureDeferred
async def test_two_workers_keep_each_conversation_on_one_host(tmp_path: Path) -> None:
    sims = {name: SimulatedHost({"tiny-a": "loaded"}, slots=1, chunks=4) for name in HOSTS}
    for sim in sims.values():
        await sim.listen(0, "127.0.0.1")
    try:
        urls = {name: sim.url for name, sim in sims.items()}
        result = await deferToThread(workers_alternate, tmp_path, urls)
    finally:
        for sim in sims.values():
            await sim.stop()
    went = result["went"]
    assert all(len(set(hosts)) == 1 for hosts in went), went


@pytest_twisted.ensureDeferred
async def test_two_replicas_keep_each_conversation_on_one_host(tmp_path: Path) -> None:
    """Without the shared placements, the replica that meets a conversation at its second
    turn places it by its own table, and half of them move (measured: 5 of 10)."""
    sims = {name: SimulatedHost({"tiny-a": "loaded"}, slots=1, chunks=4) for name in HOSTS}
    for sim in sims.values():
        await sim.listen(0, "127.0.0.1")
    try:
        with running_redis(tmp_path) as store:
            urls = {name: sim.url for name, sim in sims.items()}
            result = await deferToThread(alternate, tmp_path, urls, store.url)
    finally:
        for sim in sims.values():
            await sim.stop()
    went = result["went"]
    assert all(len(set(hosts)) == 1 for hosts in went), went
    per_host = Counter(hosts[0] for hosts in went)
    assert len(per_host) == len(HOSTS) and max(per_host.values()) <= 4, went  # spread out

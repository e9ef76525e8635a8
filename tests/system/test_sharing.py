"""``workers: 2`` share one count of the slots: a host is never sent more requests than its
slots, whichever worker holds them, and a worker that dies gives its slots back at once.
Real processes (twistd and its worker), a simulated host in this process."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest_twisted

from crossbar.sharing import LEASE
from crossbar.sharing.storelink import BEAT
from crossbar.testing import SimulatedHost
from tests.support import Daemon, start_daemon
from tests.support.processes import beside, children, fetch, replicas, wait_until
from tests.support.redis import RedisServer, running_redis

CHUNK = 0.05
"""Seconds between two tokens of the simulated host."""
MARGIN = 0.5
"""Seconds left after a request starts before the next ones come: worker 0 tells the other
worker within a millisecond or so (that is all crossbar promises), so a loaded machine has
plenty of room."""


def config(sim_url: str) -> str:
    return (
        "workers: 2\npoll_interval: 200ms\n"
        f"hosts:\n  gpu-a:\n    url: {sim_url}\n    slots: 1\n"
        "routes:\n  lab:\n    hosts: [gpu-a]\n    default_model: m1\n    wait_timeout: 60s\n"
    )


def chat(daemon: Daemon, tokens: int | None = None) -> tuple[int, float]:
    """One streamed chat on a new connection: its status, and seconds to its last byte."""
    body: dict[str, Any] = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    if tokens is not None:
        body["max_tokens"] = tokens
    request = urllib.request.Request(
        daemon.url + "/lab/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
        return response.status, time.monotonic() - began


def both_joined(daemon: Daemon) -> bool:
    metrics = fetch(daemon.url + "/_crossbar/metrics").decode()
    return all(f'crossbar_shared_count_up{{worker="{w}"}} 1.0' in metrics for w in "01")


def holding(daemon: Daemon, worker: str) -> bool:
    metrics = fetch(daemon.url + "/_crossbar/metrics").decode()
    return f'crossbar_in_flight_requests{{host="gpu-a",worker="{worker}"}} 1.0' in metrics


@contextmanager
def two_workers(tmp_path: Path, sim_url: str) -> Iterator[Daemon]:
    """crossbar with two workers in front of the host, once both share the count."""
    daemon = start_daemon(tmp_path, config(sim_url))
    try:
        wait_until(lambda: both_joined(daemon), "both workers to share the count")
        yield daemon
    finally:
        daemon.stop()


def one_slot_never_twice(tmp_path: Path, sim_url: str) -> dict[str, Any]:
    with two_workers(tmp_path, sim_url) as daemon, ThreadPoolExecutor(8) as pool:
        first = pool.submit(chat, daemon)  # 40 tokens, 2 s: the one slot is taken
        wait_until(lambda: holding(daemon, "0") or holding(daemon, "1"), "the first request")
        time.sleep(MARGIN)
        rest = [pool.submit(chat, daemon, 4) for _ in range(5)]  # each on a new connection
        answers = [first.result(), *(f.result() for f in rest)]
        return {"answers": answers, "output": daemon.output()}


@pytest_twisted.ensureDeferred
async def test_two_workers_never_send_the_host_more_than_its_one_slot(tmp_path: Path) -> None:
    sim = SimulatedHost({"m1": "loaded"}, slots=1, chunks=40, chunk_interval=CHUNK)
    result = await beside(sim, one_slot_never_twice, tmp_path)
    assert [status for status, _ in result["answers"]] == [200] * 6, result["output"]
    assert sim.counts()["most_waiting_in_host"] == 0  # every wait was in crossbar
    assert "the shared slot count (worker 0) is lost" not in result["output"]


def workers_of(pid: int) -> list[int]:
    """The worker processes among ``pid``'s children (not a short-lived helper of its own)."""
    found = []
    for child in children(pid):
        try:
            if b"crossbar.workers" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            pass  # gone meanwhile
    return found


def slots_back_when_a_worker_dies(tmp_path: Path, sim_url: str) -> dict[str, Any]:
    with two_workers(tmp_path, sim_url) as daemon, ThreadPoolExecutor(16) as pool:
        (child,) = wait_until(lambda: workers_of(daemon.proc.pid), "worker 1 to start")
        for _ in range(16):  # until worker 1 holds the slot (the kernel spreads them)
            started = pool.submit(chat, daemon)
            wait_until(lambda: holding(daemon, "0") or holding(daemon, "1"), "a request")
            if holding(daemon, "1"):
                break
            started.result()
        assert holding(daemon, "1"), "worker 1 never held the slot"
        os.kill(child, signal.SIGKILL)  # it dies holding the host's one slot
        wait_until(lambda: "worker 1 left holding 1 slots" in daemon.output(), "the slot back")
        status, seconds = chat(daemon, 1)  # not stuck behind a slot nobody holds
        return {"status": status, "seconds": seconds, "output": daemon.output()}


@pytest_twisted.ensureDeferred
async def test_a_worker_killed_holding_a_slot_gives_it_back_at_once(tmp_path: Path) -> None:
    sim = SimulatedHost({"m1": "loaded"}, slots=1, chunks=400, chunk_interval=CHUNK)
    result = await beside(sim, slots_back_when_a_worker_dies, tmp_path)
    assert result["status"] == 200, result["output"]
    assert result["seconds"] < 10  # not kept waiting for a slot a dead worker held


# -- replicas sharing a Redis store (shared_state) -------------------------------------------


def replica_config(sim_url: str, store_url: str) -> str:
    return config(sim_url).replace("workers: 2\n", f"shared_state: {store_url}\n")


def joined(daemon: Daemon) -> bool:
    return "crossbar_shared_count_up 1.0" in fetch(daemon.url + "/_crossbar/metrics").decode()


def holds(daemon: Daemon) -> bool:
    metrics = fetch(daemon.url + "/_crossbar/metrics").decode()
    return 'crossbar_in_flight_requests{host="gpu-a"} 1.0' in metrics


def two_replicas(tmp_path: Path, sim_url: str, store_url: str) -> Any:
    """Two crossbars in front of the host, once both share the store's count."""
    config = replica_config(sim_url, store_url)
    return replicas(tmp_path, config, joined, "each replica to share the store's count")


def replicas_never_twice(tmp_path: Path, sim_url: str, store_url: str) -> dict[str, Any]:
    with two_replicas(tmp_path, sim_url, store_url) as replicas, ThreadPoolExecutor(8) as pool:
        first = pool.submit(chat, replicas[0])  # 40 tokens, 2 s: the one slot is taken
        wait_until(lambda: holds(replicas[0]), "the first request")
        time.sleep(MARGIN)
        rest = [pool.submit(chat, replicas[n % 2], 4) for n in range(5)]  # alternating
        answers = [first.result(), *(f.result() for f in rest)]
        return {"answers": answers, "output": "".join(r.output() for r in replicas)}


@pytest_twisted.ensureDeferred
async def test_two_replicas_never_send_the_host_more_than_its_one_slot(tmp_path: Path) -> None:
    sim = SimulatedHost({"m1": "loaded"}, slots=1, chunks=40, chunk_interval=CHUNK)
    with running_redis(tmp_path) as store:
        work = partial(replicas_never_twice, store_url=store.url)
        result = await beside(sim, work, tmp_path)
    assert [status for status, _ in result["answers"]] == [200] * 6, result["output"]
    assert sim.counts()["most_waiting_in_host"] == 0, result["output"]  # every wait in crossbar
    assert "is lost" not in result["output"]


def slots_back_when_a_replica_dies(tmp_path: Path, sim_url: str, store_url: str) -> dict[str, Any]:
    with two_replicas(tmp_path, sim_url, store_url) as replicas, ThreadPoolExecutor(2) as pool:
        pool.submit(chat, replicas[0])  # 400 tokens, 20 s: the one slot is taken
        wait_until(lambda: holds(replicas[0]), "the first request")
        replicas[0].proc.send_signal(signal.SIGKILL)  # it dies holding the host's one slot
        killed = time.monotonic()
        status, _ = chat(replicas[1], 1)  # waits for the slot only until the lease runs out
        return {"status": status, "seconds": time.monotonic() - killed,
                "output": replicas[1].output()}  # fmt: skip


@pytest_twisted.ensureDeferred
async def test_a_replica_killed_holding_a_slot_gives_it_back_within_the_lease(
    tmp_path: Path,
) -> None:
    """Only the store can tell the other replica that the slot is free: it drops the dead
    one a lease (10 s) after its last word, and offers its slot to the request waiting."""
    sim = SimulatedHost({"m1": "loaded"}, slots=1, chunks=400, chunk_interval=CHUNK)
    with running_redis(tmp_path) as store:
        work = partial(slots_back_when_a_replica_dies, store_url=store.url)
        result = await beside(sim, work, tmp_path)
    assert result["status"] == 200, result["output"]
    assert result["seconds"] < LEASE + BEAT + 3, result  # 3 s for a loaded machine


def store_lost_and_back(tmp_path: Path, sim_url: str, store: RedisServer) -> dict[str, Any]:
    with two_replicas(tmp_path, sim_url, store.url) as replicas:
        store.stop()
        wait_until(lambda: not any(joined(r) for r in replicas), "both to count their own")
        served = [chat(r, 1)[0] for r in replicas]  # traffic goes on without the store
        store.start()
        wait_until(lambda: all(joined(r) for r in replicas), "both to share the count again")
        wait_until(lambda: all("count is back" in r.output() for r in replicas), "the log")
        return {"served": served, "output": [r.output() for r in replicas]}


@pytest_twisted.ensureDeferred
async def test_a_store_that_stops_never_stops_traffic(tmp_path: Path) -> None:
    """Each replica says once that it counts its own, serves on, and comes back by itself."""
    sim = SimulatedHost({"m1": "loaded"}, slots=1, chunks=4, chunk_interval=CHUNK)
    with running_redis(tmp_path) as store:
        result = await beside(sim, partial(store_lost_and_back, store=store), tmp_path)
    assert result["served"] == [200, 200]
    for output in result["output"]:
        lost = [line for line in output.splitlines() if "the shared slot count" in line]
        assert len(lost) == 2, output  # once lost, once back
        assert "is lost" in lost[0] and "redis://127.0.0.1:" in lost[0]
        assert "is back" in lost[1]

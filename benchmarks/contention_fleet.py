"""The processes of ``benchmarks/contention.py``: simulated or real hosts and a crossbar
with one named key per flow in front of them, started fresh for each run and stopped after it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.affinity_fleet import MODEL, ROUTE, get_json, start_host
from tests.support import REPO, Daemon, free_port, start_daemon
from tests.support.redis import RedisServer, redis_binary

HEAVY, LIGHT = "heavy", ("light-1", "light-2", "light-3")
KEYS = {name: f"contention-{name}-0123456789abcdef" for name in (HEAVY, *LIGHT)}


def crossbar_yaml(
    urls: Sequence[str], slots: int, queue: bool, workers: int = 1, store: str | None = None
) -> str:
    names = [f"gpu-{i + 1}" for i in range(len(urls))]
    lines = ["log_format: json", "poll_interval: 250ms", f"workers: {workers}"]
    lines += [f"shared_state: {store}"] if store else []
    lines += ["hosts:"]
    for name, url in zip(names, urls, strict=True):
        lines += [f"  {name}:", f"    url: {url}", f"    slots: {slots}"]
    lines += [
        "routes:",
        f"  {ROUTE}:",
        f"    hosts: [{', '.join(names)}]",
        f"    default_model: {MODEL}",
        "    policy: least_busy",
        *(["    queue: false"] if not queue else []),
        "    api_keys:",
        *(f'      - {{name: {name}, key: "{key}"}}' for name, key in KEYS.items()),
    ]
    return "\n".join(lines) + "\n"


def page(proxy: Daemon, path: str) -> bytes | None:
    """A status page of ``proxy`` (the pages take the route's keys); ``None`` if none came."""
    request = urllib.request.Request(f"{proxy.url}/_crossbar/{path}")
    request.add_header("Authorization", f"Bearer {KEYS[HEAVY]}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            body: bytes = response.read()
            return body
    except OSError:
        return None


def fleet_ready(proxy: Daemon, count: int) -> bool:
    """True once crossbar has seen every host healthy with the model loaded."""
    try:
        hosts = json.loads(page(proxy, "status") or b"{}").get("hosts", {})
    except ValueError:
        return False
    return len(hosts) == count and all(
        h["healthy"] and MODEL in h["loaded"] for h in hosts.values()
    )


def start_simulator(args: argparse.Namespace, workdir: Path) -> tuple[Daemon, list[str]]:
    """One simulator process serving ``--hosts`` hosts (``--host PORT:MODELS`` for each more)."""
    ports = [free_port() for _ in range(args.hosts)]
    argv = [sys.executable, "-m", "crossbar.testing.simulator", "--listen", str(ports[0])]
    argv += ["--models", f"{MODEL}=loaded", "--slots", str(args.slots)]
    most = round(args.tokens * (1 + args.spread))  # max_tokens cuts each answer to its own
    argv += ["--chunks", str(most), "--chunk-interval", str(args.chunk_interval)]
    for port in ports[1:]:
        argv += ["--host", f"{port}:{MODEL}=loaded"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sim = Daemon.start(argv, ports[0], workdir / "simulator.log", cwd=workdir, env=env)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    if not sim.wait(lambda: all(get_json(f"{u}/health") for u in urls), 30):
        sim.stop()
        raise SystemExit(f"contention.py: the simulator did not start:\n{sim.log()}")
    return sim, urls


def shared(proxy: Daemon) -> bool:
    """True once the replica counts the others' slots (the store's count is heard)."""
    return b"crossbar_shared_count_up 1.0" in (page(proxy, "metrics") or b"")


@contextmanager
def fleet(
    args: argparse.Namespace, queue: bool, real: Any, store: bool = True, replicas: int = 1
) -> Iterator[list[Daemon]]:
    """Fresh hosts and fresh crossbars (``--replicas``, sharing a fresh redis-server unless
    ``store`` is false) for one run, stopped afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="contention-", dir=args.workdir))
    hosts: list[Daemon] = []
    proxies: list[Daemon] = []
    redis: RedisServer | None = None
    try:
        if real is None:
            sim, urls = start_simulator(args, workdir)
            hosts.append(sim)
        else:
            binary, model = real
            hosts += [start_host(args, binary, model, workdir) for _ in range(args.hosts)]
            urls = [host.url for host in hosts]
        url = None
        if replicas > 1 and store:
            redis = RedisServer(redis_binary(), workdir)
            redis.start()
            url = redis.url
        config = crossbar_yaml(urls, args.slots, queue, args.workers, url)
        for n in range(replicas):
            (workdir / f"crossbar-{n}").mkdir()
            proxy = start_daemon(workdir / f"crossbar-{n}", config)
            proxies.append(proxy)
            if not proxy.wait(lambda p=proxy: fleet_ready(p, len(urls)), 30):
                raise SystemExit(f"contention.py: crossbar never saw every host up:\n{proxy.log()}")
            if url and not proxy.wait(lambda p=proxy: shared(p), 30):
                raise SystemExit(f"contention.py: a replica never joined the store:\n{proxy.log()}")
        if args.workers > 1:
            time.sleep(3)  # the other workers start, poll and join worker 0's count
        yield proxies
    finally:
        for daemon in proxies + hosts:
            daemon.stop()
        if redis is not None:
            redis.stop()

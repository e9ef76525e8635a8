"""The processes of ``benchmarks/affinity.py``: real ``llama-server`` hosts and crossbar
replicas in front of them, started fresh for each run and stopped after it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import REPO, Daemon, free_port, start_daemon
from tests.support.redis import RedisServer, redis_binary

MODEL = "tiny-bench"
ROUTE = "bench"

STORE = ", shared store"
"""A run named so has its crossbar replicas share one count of the slots (a fresh
redis-server, ``shared_state``)."""
WORKERS = ", 2 workers"
"""A run named so has one crossbar of two workers (``workers: 2``): each new connection
goes to either."""
SAVES = "+saves"
"""A run named so has its hosts started with ``--slot-save-path``: crossbar keeps the shared
prefix saved on each and restores it before each new conversation."""


def post(url: str, body: dict[str, Any], timeout: float = 600) -> tuple[dict[str, Any], str]:
    """POST JSON, return the decoded answer and its ``X-Crossbar-Host`` header."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response), response.headers.get("X-Crossbar-Host", "")


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    return " ".join((done.stdout + done.stderr).split())


def llama_server_binary(given: str | None) -> Path:
    path = given or os.environ.get("CROSSBAR_LLAMA_SERVER")
    if not path:
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "llama-server.sh")],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"affinity.py: scripts/llama-server.sh failed:\n{done.stderr[-2000:]}")
        path = done.stdout.strip().splitlines()[-1]
    return Path(path)


def start_host(
    args: argparse.Namespace, binary: Path, model: Path, workdir: Path, saves: bool = False
) -> Daemon:
    """One llama-server; ``saves``: started with ``--slot-save-path`` (a folder of its own)."""
    port = free_port()
    argv = [
        str(binary), "-m", str(model), "--alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--override-kv", f"llama.context_length=int:{args.ctx}",
        "-c", str(args.ctx), "-np", str(args.slots),
        "-t", str(args.threads), "-tb", str(args.threads),
    ]  # fmt: skip
    if saves:
        (workdir / f"slots-{port}").mkdir()
        argv += ["--slot-save-path", str(workdir / f"slots-{port}")]
    host = Daemon.start(argv, port, workdir / f"host-{port}.log", cwd=workdir)
    if not host.wait(lambda: get_json(f"{host.url}/health") == {"status": "ok"}, 60):
        host.stop()
        raise SystemExit(f"affinity.py: llama-server did not become healthy:\n{host.log()}")
    return host


def crossbar_yaml(
    policy: str,
    hosts: Sequence[Daemon],
    slots: int | None,
    store: str | None = None,
    workers: int = 1,
) -> str:
    names = [f"gpu-{i + 1}" for i in range(len(hosts))]
    lines = ["poll_interval: 250ms", *([f"shared_state: {store}"] if store else [])]
    lines += [f"workers: {workers}"] * (workers > 1) + ["hosts:"]
    for name, host in zip(names, hosts, strict=True):
        lines += [f"  {name}:", f"    url: {host.url}"] + [f"    slots: {slots}"] * bool(slots)
    lines += [
        "routes:",
        f"  {ROUTE}:",
        f"    hosts: [{', '.join(names)}]",
        f"    default_model: {MODEL}",
        f"    policy: {policy}",
    ]
    return "\n".join(lines) + "\n"


def fleet_ready(proxy: Daemon, count: int, workers: int = 1) -> bool:
    """True once crossbar has seen every host healthy with the model loaded (and, with
    workers, every worker shares the slot count)."""
    if workers > 1:
        try:
            with urllib.request.urlopen(f"{proxy.url}/_crossbar/metrics", timeout=2) as answer:
                metrics = answer.read().decode()
        except OSError:
            return False
        up = [f'crossbar_shared_count_up{{worker="{n}"}} 1.0' for n in range(workers)]
        if not all(line in metrics for line in up):
            return False
    status = get_json(f"{proxy.url}/_crossbar/status")
    hosts = (status or {}).get("hosts", {})
    return len(hosts) == count and all(
        h["healthy"] and MODEL in h["loaded"] for h in hosts.values()
    )


@contextmanager
def fleet(
    args: argparse.Namespace, binary: Path, model: Path, policy: str, replicas: int
) -> Iterator[tuple[list[Daemon], list[Daemon]]]:
    """Fresh hosts and crossbar replicas for one run (in a new folder next to the model),
    stopped afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=model.parent))
    hosts: list[Daemon] = []
    proxies: list[Daemon] = []
    redis: RedisServer | None = None
    try:
        saves = policy.endswith(SAVES)
        hosts = [start_host(args, binary, model, workdir, saves) for _ in range(args.hosts)]
        slots = None if args.no_host_slots else args.slots
        if policy.endswith(STORE):  # the replicas share one count of the slots
            redis = RedisServer(redis_binary(), workdir)
            redis.start()
        store = None if redis is None else redis.url
        workers = 2 if policy.endswith(WORKERS) else 1
        name = policy.split(",")[0].removesuffix(SAVES)
        config = crossbar_yaml(name, hosts, slots, store, workers)
        for i in range(replicas):
            folder = workdir / f"crossbar-{i + 1}"
            folder.mkdir()
            proxy = start_daemon(folder, config)
            proxies.append(proxy)
            if not proxy.wait(lambda p=proxy: fleet_ready(p, len(hosts), workers), 30):
                raise SystemExit(f"affinity.py: crossbar never saw every host up:\n{proxy.log()}")
        yield hosts, proxies
    finally:
        for daemon in proxies + hosts:
            daemon.stop()
        if redis is not None:
            redis.stop()

"""The processes of a ``run.py`` run: the fake upstream and every proxy in front of it,
started together and stopped together, and one measured phase through one of them.

crossbar runs as ``twistd -n crossbar`` from this interpreter's directory with a config
written into the run's temp directory; Caddy and nginx come from ``peers.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peers
from loads import run_streams, run_wrk, stream_load
from procstat import CLK_TCK, RssSampler, cpu_ns, cpu_ticks, threads, tree

HERE = Path(__file__).resolve().parent
ROUTE = "bench"
MODEL = "bench-model"
KEY = "bench-key-0123456789abcdef"  # the keyed crossbar's only key
PATHS = ("direct", "crossbar", "crossbar-features", "caddy", "nginx")
CROSSBARS = ("crossbar", "crossbar-features")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def crossbar_twistd(python: Path | None) -> Path:
    """The ``twistd`` crossbar runs under: beside ``python`` (the virtualenv's interpreter,
    not resolved through its symlink), else beside this interpreter."""
    twistd = Path(python or sys.executable).parent / "twistd"
    if not twistd.exists():
        raise SystemExit(f"run.py: no twistd beside {python or sys.executable}")
    return twistd


def wait_for(url: str, what: str, proc: subprocess.Popen[Any], log: Path | None = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if get(url)[0] == 200:
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise SystemExit(f"run.py: {what} did not come up ({url})\n{tail}")


def stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def check_tools() -> None:
    missing = [tool for tool in ("wrk", "node") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(
            f"run.py: {' and '.join(missing)} not found on PATH; "
            "on Debian/Ubuntu: apt-get install -y wrk nodejs"
        )
    twistd = Path(sys.executable).parent / "twistd"
    if not twistd.exists():
        raise SystemExit(f"run.py: {twistd} not found; run me with the virtualenv's python")


def crossbar_config(
    path: Path,
    port: int,
    upstream: int,
    backlog: int | None,
    workers: int,
    features: bool = False,
) -> None:
    """One host, one route; ``features``: the route keyed, ``cache_affinity``, JSON log."""
    listen = f"tcp:{port}:interface=127.0.0.1" + (f":backlog={backlog}" if backlog else "")
    path.write_text(
        f'listen: "{listen}"\n'
        + (f"workers: {workers}\n" if workers > 1 else "")
        + ("log_format: json\n" if features else "")
        + "poll_interval: 5s\n"
        "hosts:\n"
        f"  upstream: http://127.0.0.1:{upstream}\n"
        "routes:\n"
        f"  {ROUTE}:\n"
        "    hosts: [upstream]\n"
        f"    default_model: {MODEL}\n"
        + (f'    policy: cache_affinity\n    api_keys: ["{KEY}"]\n' if features else "")
    )


class Bench:
    """The upstream and every proxy of the run, started together, and one measured phase."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.paths: list[str] = list(getattr(args, "paths", ("direct", "crossbar")))
        self.upstream_port = free_port()
        self.crossbar_port = free_port()
        self.ports = {"crossbar": self.crossbar_port}  # the proxies, in the order of paths
        self.ports.update({p: free_port() for p in self.paths if p not in ("direct", "crossbar")})
        self.upstream: subprocess.Popen[Any] | None = None
        self.crossbar: subprocess.Popen[Any] | None = None
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self.logs: dict[str, Path] = {}
        self.sampler: RssSampler | None = None
        self.log = workdir / "crossbar.log"
        self.probe_log = workdir / "probe.json"

    @property
    def urls(self) -> dict[str, str]:
        urls = {"direct": f"http://127.0.0.1:{self.upstream_port}/v1/chat/completions"}
        for path, port in self.ports.items():
            prefix = f"/{ROUTE}" if path in CROSSBARS else ""
            urls[path] = f"http://127.0.0.1:{port}{prefix}/v1/chat/completions"
        return urls

    def pids(self, path: str) -> list[int]:
        """The processes serving ``path`` (nginx's master and worker, crossbar's workers)."""
        return tree(self.procs[path].pid) if path in self.procs else []

    def upstream_stats(self) -> dict[str, int]:
        status, body = get(f"http://127.0.0.1:{self.upstream_port}/_bench/stats")
        stats: dict[str, int] = json.loads(body) if status == 200 else {}
        return stats

    def _start_crossbar(self, path: str) -> None:
        features = path == "crossbar-features"
        config = self.workdir / f"{path}.yaml"
        crossbar_config(
            config,
            self.ports[path],
            self.upstream_port,
            self.args.backlog,
            self.args.workers,
            features,
        )
        twistd = crossbar_twistd(self.args.python)
        env = dict(os.environ)
        paths = [p for p in (env.get("PYTHONPATH"),) if p]
        if self.args.crossbar_src is not None:
            paths.insert(0, str(self.args.crossbar_src))
        if self.args.probe and not features:
            paths.insert(0, str(HERE / "probe"))
            env["CROSSBAR_BENCH_PROBE"] = str(self.probe_log)
            if self.args.gc_tune:
                env["CROSSBAR_BENCH_GC_TUNE"] = self.args.gc_tune
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        log = self.workdir / f"{path}.log"
        with open(log, "wb") as out:
            self.procs[path] = subprocess.Popen(
                [str(twistd), "-n", "--pidfile=", "crossbar", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
            )
        self.logs[path] = log

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        try:
            self.upstream = subprocess.Popen(
                ["node", str(HERE / "upstream.js"), str(self.upstream_port)],
                stdout=subprocess.DEVNULL,
            )
            wait_for(f"http://127.0.0.1:{self.upstream_port}/health", "upstream", self.upstream)
            for path in self.ports:
                if path in CROSSBARS:
                    self._start_crossbar(path)
                else:
                    self.procs[path], self.logs[path] = peers.start(
                        path, self.workdir, self.ports[path], self.upstream_port
                    )
            self.crossbar = self.procs["crossbar"]
            for path, port in self.ports.items():
                url = f"http://127.0.0.1:{port}" + {
                    "crossbar": f"/{ROUTE}/v1/models",
                    "crossbar-features": "/_crossbar/readyz",  # its route wants a key
                }.get(path, "/health")
                wait_for(url, path, self.procs[path], self.logs[path])
            if self.args.workers > 1:
                time.sleep(2)  # let the other workers start
            self.sampler = RssSampler(self.pids("crossbar"))
            self.sampler.start()
            yield
        finally:
            if self.sampler is not None:
                self.sampler.stopped.set()
            for proc in self.procs.values():
                stop(proc)
            stop(self.upstream)

    def phase(self, mode: str, workload: str, **load: Any) -> dict[str, Any]:
        """One measured run of one workload, direct or through one proxy."""
        assert self.upstream is not None and self.sampler is not None
        px, up = self.pids(mode), [self.upstream.pid]
        self.sampler.pids = px
        self.sampler.take_peak()
        key = KEY if mode == "crossbar-features" else None
        before = (cpu_ticks(px), cpu_ns(px), cpu_ticks(up), self.upstream_stats())
        url = self.urls[mode]
        if workload == "wrk":
            result = run_wrk(url, self.args.seconds, self.args.connections, self.args.threads, key)
        else:
            k, staggered = stream_load(load["load"])
            ramp = self.args.chunks * self.args.interval if staggered else 0
            result = run_streams(url, k, self.args.chunks, self.args.interval, ramp=ramp, key=key)
            result["load"] = load["load"]
        after = (cpu_ticks(px), cpu_ns(px), cpu_ticks(up), self.upstream_stats())
        result.update(
            mode=mode,
            workload=workload,
            proxy_cpu_ms=(after[0] - before[0]) * 1000 / CLK_TCK,
            proxy_cpu_ns_schedstat=after[1] - before[1],
            upstream_cpu_ms=(after[2] - before[2]) * 1000 / CLK_TCK,
            upstream_connections=after[3].get("connections", 0) - before[3].get("connections", 0),
            proxy_peak_rss_kb=self.sampler.take_peak() if px else 0,
            proxy_threads=threads(px),
        )
        return result

    def settle(self) -> None:
        time.sleep(self.args.pause)

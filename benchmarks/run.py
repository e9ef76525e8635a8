"""The crossbar benchmark, in one command:

    .venv/bin/python benchmarks/run.py [--rounds N] [--quick] [--soak MINUTES]

Starts a fast fake llama-server (``benchmarks/upstream.js``, Node.js) and, in front of it,
crossbar (``twistd -n crossbar`` from this interpreter's directory, logging one line per
request to a file as it does in production), a second crossbar with API keys on the route,
``policy: cache_affinity`` and ``log_format: json``, and Caddy and nginx when installed
(``benchmarks/peers.py``). It runs the same workloads direct to the upstream and through
each proxy, interleaved, in an order that rotates every round:

- non-streaming: ``wrk`` POSTs a small chat completion (``benchmarks/post.lua``) on 64
  connections;
- streaming: ``benchmarks/stream_client.js`` opens K = 1, 100, 500 concurrent SSE streams at
  once, and K = 500 "staggered": one after another over the length of a stream.

Each proxy's CPU time is read from ``/proc/<pid>/stat`` (utime + stime, its child processes
included) before and after each phase through it and divided by the requests or chunks
delivered: unlike req/s, that figure holds on a busy shared machine. Resident memory is
sampled from ``/proc/<pid>/status``. Tables are printed, crossbar's figures as ratios of
Caddy's and nginx's among them, and everything is written to ``benchmarks/results/<date>.json``.

Needs ``wrk`` and ``node`` (Debian: ``apt-get install -y wrk nodejs``); installs nothing.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROUTE = "bench"
MODEL = "bench-model"
KEY = "bench-key-0123456789abcdef"  # the keyed crossbar's only key
PATHS = ("direct", "crossbar", "crossbar-features", "caddy", "nginx")
CROSSBARS = ("crossbar", "crossbar-features")
LABELS = {"crossbar-features": "crossbar (keys, cache_affinity, json log)"}


# ---------------------------------------------------------------------------- /proc


def tree(pid: int) -> list[int]:
    """The process and its descendants (crossbar's ``workers: N`` are its children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def cpu_ticks(pids: list[int]) -> int:
    """utime + stime of the processes (all their threads), in clock ticks."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total


def cpu_ns(pids: list[int]) -> int:
    """On-CPU time of every thread from ``schedstat``, in ns: a finer cross-check."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    return total


def status_kb(pids: list[int], key: str) -> int:
    """A ``/proc/<pid>/status`` figure (VmRSS, VmHWM, Threads), summed over the processes."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
                    break
    return total


def threads(pids: list[int]) -> int:
    return status_kb(pids, "Threads")


class RssSampler(threading.Thread):
    """Samples VmRSS every ``period`` seconds; ``take_peak`` returns and resets the peak."""

    def __init__(self, pids: list[int], period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.period = period
        self.peak_kb = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak_kb = max(self.peak_kb, status_kb(self.pids, "VmRSS"))
            time.sleep(self.period)

    def take_peak(self) -> int:
        peak, self.peak_kb = self.peak_kb, 0
        return max(peak, status_kb(self.pids, "VmRSS"))


# ---------------------------------------------------------------------------- processes


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


# ---------------------------------------------------------------------------- load


def run_wrk(
    url: str, seconds: float, connections: int, threads_: int, key: str | None = None
) -> dict[str, Any]:
    cmd = ["wrk", f"-t{threads_}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s"]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    cmd += ["-s", str(HERE / "post.lua"), url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            result: dict[str, Any] = json.loads(line[len("WRK_JSON ") :])
            return result
    raise SystemExit(f"run.py: no result from wrk:\n{out}")


def run_streams(
    url: str,
    k: int,
    chunks: int,
    interval: float,
    duration: float = 0,
    ramp: float = 0,
    key: str | None = None,
) -> Any:
    cmd = ["node", str(HERE / "stream_client.js"), "--url", url]
    cmd += ["--streams", str(k), "--chunks", str(chunks), "--interval", f"{interval:g}"]
    if key:
        cmd += ["--key", key]
    if ramp:
        cmd += ["--ramp", f"{ramp:g}"]
    if duration:
        cmd += ["--duration", f"{duration:g}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


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
        twistd = Path(sys.executable).parent / "twistd"
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


# ---------------------------------------------------------------------------- summary


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def stream_load(spec: str) -> tuple[int, bool]:
    """``"500"``: 500 streams opened at once; ``"500s"``: staggered over one stream's length."""
    return int(spec.rstrip("s")), spec.endswith("s")


def summarize(
    phases: list[dict[str, Any]], streams: list[str], paths: list[str] | None = None
) -> dict[str, Any]:
    """Per path: CPU over the rounds divided by the work done, medians of the latencies."""
    out: dict[str, Any] = {"wrk": {}, "streams": {}}
    paths = paths or list(PATHS)
    for mode in paths:
        runs = [p for p in phases if p["workload"] == "wrk" and p["mode"] == mode]
        if not runs:
            continue
        requests = sum(r["requests"] for r in runs)
        seconds = sum(r["duration_us"] for r in runs) / 1e6
        out["wrk"][mode] = {
            "rounds": len(runs),
            "requests": requests,
            "errors": sum(sum(r["errors"].values()) for r in runs),
            "rps": requests / seconds,
            "p50_ms": _median([r["latency_us"]["p50"] / 1000 for r in runs]),
            "p99_ms": _median([r["latency_us"]["p99"] / 1000 for r in runs]),
            "cpu_ms_per_request": sum(r["proxy_cpu_ms"] for r in runs) / max(requests, 1),
            "cpu_ms_per_request_schedstat": sum(r["proxy_cpu_ns_schedstat"] for r in runs)
            / 1e6
            / max(requests, 1),
            "upstream_cpu_ms_per_request": sum(r["upstream_cpu_ms"] for r in runs)
            / max(requests, 1),
            "upstream_connections": sum(r["upstream_connections"] for r in runs),
            "peak_rss_kb": max(r["proxy_peak_rss_kb"] for r in runs),
        }
    if "direct" in out["wrk"]:
        for s in out["wrk"].values():
            s["ratio_to_direct"] = s["rps"] / out["wrk"]["direct"]["rps"]
    for k in streams:
        per_k: dict[str, Any] = {}
        for mode in paths:
            runs = [
                p
                for p in phases
                if p["workload"] == "streams" and p["mode"] == mode and p["load"] == k
            ]
            if not runs:
                continue
            chunks = sum(r["chunks"] for r in runs)
            per_k[mode] = {
                "rounds": len(runs),
                "started": sum(r["started"] for r in runs),
                "completed": sum(r["completed"] for r in runs),
                "chunks": chunks,
                "ttfc_p50_ms": _median([r["ttfc_ms"]["p50"] for r in runs]),
                "ttfc_p99_ms": _median([r["ttfc_ms"]["p99"] for r in runs]),
                "delay_p50_ms": _median([r["chunk_delay_ms"]["p50"] for r in runs]),
                "delay_p99_ms": _median([r["chunk_delay_ms"]["p99"] for r in runs]),
                "cpu_us_per_chunk": sum(r["proxy_cpu_ms"] for r in runs) * 1000 / max(chunks, 1),
                "cpu_us_per_chunk_schedstat": sum(r["proxy_cpu_ns_schedstat"] for r in runs)
                / 1000
                / max(chunks, 1),
                "upstream_connections": sum(r["upstream_connections"] for r in runs),
                "peak_rss_kb": max(r["proxy_peak_rss_kb"] for r in runs),
            }
        direct = per_k.get("direct", {}).get("ttfc_p50_ms")
        for s in per_k.values():
            s["ttfc_p50_vs_direct"] = (
                s["ttfc_p50_ms"] / direct if direct and s["ttfc_p50_ms"] is not None else None
            )
        out["streams"][k] = per_k
    crossbars = [m for m in CROSSBARS if m in paths]
    others = [m for m in peers.PEERS if m in paths]
    out["ratios"] = peers.ratios(out, crossbars, others)
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_tables(summary: dict[str, Any], args: argparse.Namespace) -> None:
    print()
    print(f"Non-streaming: wrk, {args.connections} connections, {args.seconds:g} s per run")
    print()
    print(
        "| path | req/s | vs direct | p50 ms | p99 ms | CPU ms/req "
        "| upstream conns opened | peak RSS MB |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for mode, s in summary["wrk"].items():
        cpu = s["cpu_ms_per_request"] if mode != "direct" else None
        rss = s["peak_rss_kb"] / 1024 if mode != "direct" else None
        print(
            f"| {LABELS.get(mode, mode)} | {s['rps']:,.0f} "
            f"| {_fmt(s.get('ratio_to_direct'), '.3f')} "
            f"| {_fmt(s['p50_ms'], '.2f')} | {_fmt(s['p99_ms'], '.2f')} | {_fmt(cpu, '.3f')} "
            f"| {s['upstream_connections']} | {_fmt(rss, '.1f')} |"
        )
    print()
    print(f"Streaming: {args.chunks} chunks per stream, one every {args.interval:g} ms")
    print()
    print(
        "| K | path | completed | TTFC p50 ms | vs direct | TTFC p99 ms | chunk delay p50 ms "
        "| chunk delay p99 ms | CPU µs/chunk | upstream conns opened | peak RSS MB |"
    )
    print("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for k, per_k in summary["streams"].items():
        for mode, s in per_k.items():
            cpu = s["cpu_us_per_chunk"] if mode != "direct" else None
            rss = s["peak_rss_kb"] / 1024 if mode != "direct" else None
            label = f"{stream_load(k)[0]} staggered" if stream_load(k)[1] else k
            print(
                f"| {label} | {LABELS.get(mode, mode)} | {s['completed']}/{s['started']} "
                f"| {_fmt(s['ttfc_p50_ms'], '.1f')} | {_fmt(s['ttfc_p50_vs_direct'], '.2f')} "
                f"| {_fmt(s['ttfc_p99_ms'], '.1f')} "
                f"| {_fmt(s['delay_p50_ms'], '.2f')} | {_fmt(s['delay_p99_ms'], '.2f')} "
                f"| {_fmt(cpu, '.1f')} | {s['upstream_connections']} | {_fmt(rss, '.1f')} |"
            )
    print()
    peers.print_ratios(summary.get("ratios", {}), LABELS)


# ---------------------------------------------------------------------------- machine


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def source_digest(src: Path) -> str:
    """A short digest of the crossbar package's files, to tell working trees apart."""
    digest = hashlib.sha1()
    for path in sorted((src / "crossbar").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def machine(src: Path | None) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    twisted = _first_line([sys.executable, "-c", "import twisted; print(twisted.__version__)"])
    commit = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = bool(_first_line(["git", "-C", str(REPO), "status", "--porcelain", "crossbar"]))
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "twisted": twisted,
        "node": _first_line(["node", "--version"]),
        "wrk": _first_line(["wrk", "--version"]),
        "crossbar_commit": commit + ("-dirty" if dirty else "") if src is None else "-",
        "crossbar_source": str(src) if src else "this checkout",
        "crossbar_files_sha1": source_digest(src or REPO),
        "loadavg": os.getloadavg(),
    }


# ---------------------------------------------------------------------------- main


def proxy_end(bench: Bench, path: str) -> dict[str, Any]:
    """A proxy's memory and log at the end of the run, and how it was configured."""
    pids = bench.pids(path)
    log = bench.logs[path] if path in CROSSBARS else bench.workdir / f"{path}-access.log"
    config = {"caddy": "Caddyfile", "nginx": "nginx.conf"}.get(path, f"{path}.yaml")
    return {
        "vmhwm_kb": status_kb(pids, "VmHWM"),
        "end_vmrss_kb": status_kb(pids, "VmRSS"),
        "threads": threads(pids),
        "processes": len(pids),
        "log_lines": log.read_bytes().count(b"\n") if log.exists() else 0,
        "config": (bench.workdir / config).read_text(),
    }


def benchmark(bench: Bench, args: argparse.Namespace) -> list[dict[str, Any]]:
    streams = args.streams
    paths = bench.paths
    # Warm every path (imports, pools, caches); not measured.
    for mode in paths:
        key = KEY if mode == "crossbar-features" else None
        run_wrk(bench.urls[mode], 1, args.connections, args.threads, key)
        run_streams(bench.urls[mode], 10, 5, 10, key=key)
    bench.settle()
    phases: list[dict[str, Any]] = []
    width = max(len(m) for m in paths)
    for rnd in range(args.rounds):
        turn = rnd % len(paths)
        order = paths[turn:] + paths[:turn]  # each path leads in turn
        for mode in order:
            p = bench.phase(mode, "wrk")
            p["round"] = rnd
            phases.append(p)
            print(
                f"round {rnd + 1} wrk     {mode:{width}} "
                f"{p['requests'] / (p['duration_us'] / 1e6):9,.0f} req/s"
                f"  CPU {p['proxy_cpu_ms']:7.0f} ms",
                flush=True,
            )
            bench.settle()
        for k in streams:
            for mode in order:
                p = bench.phase(mode, "streams", load=k)
                p["round"] = rnd
                phases.append(p)
                print(
                    f"round {rnd + 1} K={k:<5} {mode:{width}} {p['completed']}/{p['started']}"
                    f" streams  TTFC p50 {_fmt(p['ttfc_ms']['p50'], '.1f')} ms"
                    f"  CPU {p['proxy_cpu_ms']:5.0f} ms",
                    flush=True,
                )
                bench.settle()
    return phases


def soak(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Keep K streams going for ``args.soak`` minutes; report RSS every 30 s."""
    assert bench.crossbar is not None
    pid = tree(bench.crossbar.pid)
    seconds = args.soak * 60
    result: dict[str, Any] = {}

    def load() -> None:
        result.update(
            run_streams(
                bench.urls["crossbar"],
                args.soak_streams,
                args.soak_chunks,
                args.soak_interval,
                duration=seconds,
            )
        )

    t0, cpu0 = time.monotonic(), cpu_ticks(pid)
    samples: list[dict[str, Any]] = [
        {"t": 0, "rss_kb": status_kb(pid, "VmRSS"), "hwm_kb": status_kb(pid, "VmHWM")}
    ]
    print(
        f"soak: {args.soak_streams} streams of {args.soak_chunks} chunks, one every "
        f"{args.soak_interval:g} ms, for {args.soak:g} min; RSS every 30 s",
        flush=True,
    )
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(30)
        t = time.monotonic() - t0
        cpu = (cpu_ticks(pid) - cpu0) / CLK_TCK
        sample = {
            "t": round(t),
            "rss_kb": status_kb(pid, "VmRSS"),
            "anon_kb": status_kb(pid, "RssAnon"),
            "hwm_kb": status_kb(pid, "VmHWM"),
            "cpu_s": cpu,
        }
        samples.append(sample)
        print(
            f"soak t={sample['t']:5d}s  RSS {sample['rss_kb'] / 1024:6.1f} MB"
            f" (anon {sample['anon_kb'] / 1024:5.1f})  peak {sample['hwm_kb'] / 1024:6.1f} MB"
            f"  CPU {cpu:7.1f} s",
            flush=True,
        )
    chunks = result.get("chunks", 0)
    cpu_s = (cpu_ticks(pid) - cpu0) / CLK_TCK
    print(
        f"soak: {result.get('completed')}/{result.get('started')} streams completed, "
        f"{chunks} chunks, crossbar CPU {cpu_s * 1e6 / max(chunks, 1):.1f} µs/chunk"
    )
    return {"client": result, "samples": samples, "crossbar_cpu_s": cpu_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every workload (3)")
    parser.add_argument(
        "--quick", action="store_true", help="one round, 3 s wrk runs, K = 100,500,500s"
    )
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"what to measure, in order ({','.join(PATHS)}); "
        "caddy and nginx are left out when not installed",
    )
    parser.add_argument("--seconds", type=float, default=8, help="seconds per wrk run (8)")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections (64)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument(
        "--streams",
        default=None,
        help="concurrent stream counts K; 's' staggers their start (1,100,500,500s)",
    )
    parser.add_argument("--chunks", type=int, default=50, help="chunks per stream (50)")
    parser.add_argument("--interval", type=float, default=20, help="ms between chunks (20)")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between runs (0.5)")
    parser.add_argument(
        "--backlog", type=int, default=None, help="add :backlog=N to crossbar's listen endpoint"
    )
    parser.add_argument(
        "--soak", type=float, default=0, metavar="MINUTES", help="only a streaming soak run"
    )
    parser.add_argument(
        "--soak-streams", type=int, default=500, help="concurrent streams in --soak (500)"
    )
    parser.add_argument(
        "--soak-chunks", type=int, default=200, help="chunks per stream in --soak (200)"
    )
    parser.add_argument(
        "--soak-interval", type=float, default=100, help="ms between chunks in --soak (100)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="crossbar's workers: N (1); CPU is summed"
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="count crossbar's getaddrinfo calls and GC time (benchmarks/probe/)",
    )
    parser.add_argument(
        "--crossbar-src",
        type=Path,
        default=None,
        help="run the crossbar package from this directory (another checkout) instead",
    )
    parser.add_argument(
        "--gc-tune",
        default="",
        metavar="freeze,threshold=N",
        help="with --probe: try GC settings in crossbar (see benchmarks/probe/)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 3
    if args.streams is None:
        args.streams = "100,500,500s" if args.quick else "1,100,500,500s"
    args.streams = [k.strip() for k in str(args.streams).split(",") if k.strip()]
    args.paths = [p.strip() for p in str(args.paths).split(",") if p.strip()]
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown or "crossbar" not in args.paths:
        raise SystemExit(f"run.py: --paths takes some of {','.join(PATHS)}, crossbar included")
    if args.soak:
        args.paths = ["crossbar"]
    wanted = [p for p in args.paths if p in peers.PEERS]
    found = peers.available(wanted)
    args.paths = [p for p in args.paths if p not in wanted or p in found]
    check_tools()

    started = dt.datetime.now().astimezone()
    t0 = time.monotonic()
    info = machine(args.crossbar_src)
    info.update({name: peers.version(name) for name in found})
    print(
        f"crossbar benchmark {started:%Y-%m-%d %H:%M %Z}: {info['nproc']} x {info['cpu']}, "
        f"Linux {info['kernel']}, Python {info['python']}, Twisted {info['twisted']}, "
        f"node {info['node']}, crossbar {info['crossbar_commit']} "
        f"(files {info['crossbar_files_sha1']})",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="crossbar-bench-") as tmp:
        bench = Bench(args, Path(tmp))
        with bench.running():
            assert bench.crossbar is not None
            pid = tree(bench.crossbar.pid)
            proxies = {p: {"start_rss_kb": status_kb(bench.pids(p), "VmRSS")} for p in bench.procs}
            base: dict[str, Any] = {
                "started": started.isoformat(timespec="seconds"),
                "machine": info,
                "settings": {
                    k: str(v) if isinstance(v, Path) else v
                    for k, v in vars(args).items()
                    if k != "out" and v is not None
                },
                "crossbar_start_rss_kb": status_kb(pid, "VmRSS"),
            }
            if args.soak:
                results: dict[str, Any] = {**base, "soak": soak(bench, args)}
                suffix = "-soak"
            else:
                phases = benchmark(bench, args)
                summary = summarize(phases, args.streams, bench.paths)
                results = {**base, "summary": summary, "phases": phases}
                suffix = ""
            results["crossbar_vmhwm_kb"] = status_kb(pid, "VmHWM")
            for key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                results[f"crossbar_end_{key.lower()}_kb"] = status_kb(pid, key)
            results["crossbar_threads"] = threads(pid)
            results["upstream_stats"] = bench.upstream_stats()
            log_lines = bench.log.read_bytes().count(b"\n")
            results["crossbar_log_lines"] = log_lines
            for p, about in proxies.items():
                about.update(proxy_end(bench, p))
            results["proxies"] = proxies
        results["machine"]["loadavg_end"] = os.getloadavg()
        if args.probe:
            probe = json.loads(bench.probe_log.read_text()) if bench.probe_log.exists() else {}
            results["crossbar_probe"] = probe

    if not args.soak:
        print_tables(results["summary"], args)
    print(
        f"crossbar RSS at start {results['crossbar_start_rss_kb'] / 1024:.1f} MB, at end "
        f"{results['crossbar_end_vmrss_kb'] / 1024:.1f} MB (anonymous "
        f"{results['crossbar_end_rssanon_kb'] / 1024:.1f}, files "
        f"{results['crossbar_end_rssfile_kb'] / 1024:.1f})"
    )
    print(
        f"crossbar peak RSS (VmHWM) {results['crossbar_vmhwm_kb'] / 1024:.1f} MB, "
        f"{results['crossbar_threads']} threads, {log_lines} log lines; "
        f"upstream accepted {results['upstream_stats'].get('connections')} connections "
        f"for {results['upstream_stats'].get('requests')} requests"
    )
    if args.probe:
        probe = results["crossbar_probe"]
        gc_s = sum(probe.get("gc", {}).get("seconds", [0.0]))
        cpu_s = probe.get("process_cpu_seconds") or 1.0
        print(
            f"crossbar getaddrinfo calls (host|thread: count): {probe.get('getaddrinfo') or 'none'}"
        )
        print(
            f"crossbar GC: collections by generation {probe.get('gc', {}).get('collections')}, "
            f"{gc_s:.2f} s = {100 * gc_s / cpu_s:.1f}% of its {cpu_s:.1f} s CPU"
        )
    for p, about in list(results["proxies"].items())[1:]:  # crossbar's own lines are above
        print(
            f"{LABELS.get(p, p)}: RSS at start {about['start_rss_kb'] / 1024:.1f} MB, "
            f"peak (VmHWM) {about['vmhwm_kb'] / 1024:.1f} MB, {about['log_lines']} log lines"
        )
    results["wall_seconds"] = round(time.monotonic() - t0, 1)
    print(f"wall time {results['wall_seconds']:.0f} s")
    out = args.out or HERE / "results" / f"{started:%Y-%m-%d-%H%M%S}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()

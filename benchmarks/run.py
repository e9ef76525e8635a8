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

The parts: ``harness.py`` starts and stops the processes and measures one phase,
``loads.py`` runs ``wrk`` and the stream client, ``procstat.py`` reads ``/proc``,
``report.py`` summarizes and prints the tables, ``machine.py`` describes what was measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import peers
from harness import CROSSBARS, KEY, PATHS, Bench, check_tools
from loads import run_streams, run_wrk
from machine import machine
from procstat import CLK_TCK, cpu_ticks, status_kb, threads, tree
from report import fmt, print_end, print_tables, summarize

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


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
                    f" streams  TTFC p50 {fmt(p['ttfc_ms']['p50'], '.1f')} ms"
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
        "--python",
        type=Path,
        default=None,
        help="run crossbar with the twistd beside this interpreter (another virtualenv's)",
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
    info = machine(args.crossbar_src, args.python)
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
    print_end(results, args)
    results["wall_seconds"] = round(time.monotonic() - t0, 1)
    print(f"wall time {results['wall_seconds']:.0f} s")
    out = args.out or HERE / "results" / f"{started:%Y-%m-%d-%H%M%S}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()

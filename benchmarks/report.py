"""What ``run.py`` makes of its phases: the per-path summary, crossbar's figures as
ratios of Caddy's and nginx's (``peers.py``), and the tables and lines it prints.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import peers
from harness import CROSSBARS, PATHS
from loads import stream_load

LABELS = {"crossbar-features": "crossbar (keys, cache_affinity, json log)"}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


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


def fmt(value: float | None, spec: str) -> str:
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
            f"| {fmt(s.get('ratio_to_direct'), '.3f')} "
            f"| {fmt(s['p50_ms'], '.2f')} | {fmt(s['p99_ms'], '.2f')} | {fmt(cpu, '.3f')} "
            f"| {s['upstream_connections']} | {fmt(rss, '.1f')} |"
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
                f"| {fmt(s['ttfc_p50_ms'], '.1f')} | {fmt(s['ttfc_p50_vs_direct'], '.2f')} "
                f"| {fmt(s['ttfc_p99_ms'], '.1f')} "
                f"| {fmt(s['delay_p50_ms'], '.2f')} | {fmt(s['delay_p99_ms'], '.2f')} "
                f"| {fmt(cpu, '.1f')} | {s['upstream_connections']} | {fmt(rss, '.1f')} |"
            )
    print()
    peers.print_ratios(summary.get("ratios", {}), LABELS)


def print_end(results: dict[str, Any], args: argparse.Namespace) -> None:
    """crossbar's memory, threads and log lines, the probe's counts, the other proxies'."""
    print(
        f"crossbar RSS at start {results['crossbar_start_rss_kb'] / 1024:.1f} MB, at end "
        f"{results['crossbar_end_vmrss_kb'] / 1024:.1f} MB (anonymous "
        f"{results['crossbar_end_rssanon_kb'] / 1024:.1f}, files "
        f"{results['crossbar_end_rssfile_kb'] / 1024:.1f})"
    )
    print(
        f"crossbar peak RSS (VmHWM) {results['crossbar_vmhwm_kb'] / 1024:.1f} MB, "
        f"{results['crossbar_threads']} threads, {results['crossbar_log_lines']} log lines; "
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

"""Before and after, side by side: two crossbars on one fake upstream, measured in turn.

    .venv/bin/python benchmarks/ab.py BEFORE_DIR AFTER_DIR [--pairs 8] [--seconds 5]
                                      [--features] [--streams K] [--chunks 50] [--out FILE]
                                      [--python-before PY] [--python-after PY]
                                      [--route-before "KEY: VALUE"] [--route-after ...]
                                      [--slots N] [--workers N]

BEFORE_DIR and AFTER_DIR each hold a ``crossbar`` package and twistd's plugin
(``git archive HEAD crossbar twisted | tar -x -C /tmp/before``; ``cp -r crossbar twisted
/tmp/after``: without ``twisted/plugins/crossbar_plugin.py`` twistd finds no crossbar).
Both crossbars run at once, each with the config ``run.py`` gives its own (``--features``:
the route keyed,
``cache_affinity``, the JSON log), and take the same load in turn, the order swapped every
pair, so that what the machine does meanwhile falls on both alike. A change of a few per
cent shows here when a full ``run.py`` of each, minutes apart, would hide it.
``--python-before`` and ``--python-after`` run a side under another virtualenv's
interpreter (its ``twistd``); ``--route-before`` and ``--route-after`` add keys to a side's
route (``"queue: false"``), so that one tree can be measured with a feature and without;
``--slots N`` gives the host ``slots: N`` on both sides (the fair queue then counts slots
on every request, as on a fleet whose hosts say theirs); ``--workers N`` runs both with
``workers: N`` (CPU summed over every worker); ``--store-before`` and ``--store-after`` give
a side ``shared_state:``, a redis-server of the run's own (its CPU is not counted).

Each run prints crossbar's CPU per request (``wrk``, 64 connections) or per chunk
(``--streams K``: K concurrent streams of ``--chunks`` chunks: a stream's own request is
spread over its chunks, the less so the longer it is), split into user and system time
from ``/proc/<pid>/stat``; then the medians and the difference of each pair (after minus
before).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import KEY, ROUTE, crossbar_config, crossbar_twistd, free_port, stop, wait_for
from loads import run_streams, run_wrk
from procstat import CLK_TCK, tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.redis import RedisServer, redis_binary

HERE = Path(__file__).resolve().parent


def user_system(pid: int) -> tuple[int, int]:
    """utime and stime of ``pid`` and its children (``workers: N``), in clock ticks."""
    user = system = 0
    for each in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{each}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
            user, system = user + int(fields[11]), system + int(fields[12])
    return user, system


def start(
    name: str,
    src: Path,
    python: Path | None,
    upstream: int,
    workdir: Path,
    features: bool,
    route: list[str],
    slots: int | None,
    workers: int = 1,
    store: str | None = None,
) -> tuple[Any, int]:
    port = free_port()
    config = workdir / f"{name}.yaml"
    crossbar_config(config, port, upstream, None, workers, features)
    if store is not None:
        config.write_text(f"shared_state: {store}\n" + config.read_text())
    if slots is not None:
        url = f"http://127.0.0.1:{upstream}"
        text = config.read_text().replace(f": {url}\n", f": {{url: {url}, slots: {slots}}}\n")
        config.write_text(text)
    with config.open("a") as f:  # the route is the config's last block
        f.writelines(f"    {line}\n" for line in route)
    twistd = crossbar_twistd(python)
    env = dict(os.environ, PYTHONPATH=str(src))
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [str(twistd), "-n", "--pidfile=", "crossbar", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
        )
    ready = "/_crossbar/readyz" if features else f"/{ROUTE}/v1/models"
    wait_for(f"http://127.0.0.1:{port}{ready}", name, proc)
    if workers > 1 or store is not None:
        time.sleep(3)  # the other workers start and join worker 0's count (or the store)
    return proc, port


def measure(proc: Any, url: str, args: argparse.Namespace, key: str | None) -> dict[str, float]:
    before = user_system(proc.pid)
    if args.streams:
        result = run_streams(url, args.streams, args.chunks, 20, key=key)
        units, extra = args.streams * args.chunks, {"ttfc_p50_ms": result["ttfc_ms"]["p50"]}
    else:
        result = run_wrk(url, args.seconds, 64, 2, key)
        units = result["requests"]
        extra = {"per_second": result["requests"] / (result["duration_us"] / 1e6)}
    after = user_system(proc.pid)
    user = (after[0] - before[0]) * 1e6 / CLK_TCK / units
    system = (after[1] - before[1]) * 1e6 / CLK_TCK / units
    return {"us": user + system, "user_us": user, "system_us": system, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a directory holding the crossbar before")
    parser.add_argument("after", type=Path, help="a directory holding the crossbar after")
    parser.add_argument("--pairs", type=int, default=8, help="pairs of runs (8)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds per wrk run (5)")
    parser.add_argument("--features", action="store_true", help="keys, cache_affinity, JSON log")
    parser.add_argument("--streams", type=int, default=0, help="K streams instead of wrk")
    parser.add_argument("--chunks", type=int, default=50, help="chunks a stream (50)")
    parser.add_argument("--route-before", action="append", default=[], help="a route key")
    parser.add_argument("--route-after", action="append", default=[], help="a route key")
    parser.add_argument("--slots", type=int, default=None, help="the host's slots (both)")
    parser.add_argument("--workers", type=int, default=1, help="workers: N on both sides (1)")
    parser.add_argument("--store-before", action="store_true", help="shared_state: a redis-server")
    parser.add_argument("--store-after", action="store_true", help="shared_state: a redis-server")
    parser.add_argument("--python-before", type=Path, default=None, help="its interpreter")
    parser.add_argument("--python-after", type=Path, default=None, help="its interpreter")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args()
    for side in (args.before, args.after):
        if not (side / "crossbar" / "__init__.py").is_file():
            raise SystemExit(f"ab.py: {side} holds no crossbar package")
    key = KEY if args.features else None
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="crossbar-ab-") as tmp:
        workdir = Path(tmp)
        upstream_port = free_port()
        upstream = subprocess.Popen(
            ["node", str(HERE / "upstream.js"), str(upstream_port)], stdout=subprocess.DEVNULL
        )
        procs: dict[str, Any] = {}
        store = None
        if args.store_before or args.store_after:
            store = RedisServer(redis_binary(), workdir)
            store.start()
        try:
            wait_for(f"http://127.0.0.1:{upstream_port}/health", "upstream", upstream)
            urls = {}
            sides = (
                ("before", args.before, args.python_before, args.route_before, args.store_before),
                ("after", args.after, args.python_after, args.route_after, args.store_after),
            )
            for name, src, python, route, shared in sides:
                url = store.url.replace("/0", f"/{len(procs)}") if shared and store else None
                procs[name], port = start(
                    name, src, python, upstream_port, workdir, args.features, route, args.slots,
                    args.workers, url,
                )  # fmt: skip
                urls[name] = f"http://127.0.0.1:{port}/{ROUTE}/v1/chat/completions"
                run_wrk(urls[name], 1, 64, 2, key)  # warm: imports, pools, caches
                run_streams(urls[name], 10, 5, 10, key=key)
            for pair in range(args.pairs):
                for name in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                    run = measure(procs[name], urls[name], args, key)
                    runs[name].append(run)
                    print(
                        f"pair {pair + 1} {name:6} {run['us']:6.1f} µs "
                        f"(user {run['user_us']:5.1f}, system {run['system_us']:5.1f})",
                        flush=True,
                    )
                    time.sleep(0.5)
        finally:
            for proc in procs.values():
                stop(proc)
            stop(upstream)
            if store is not None:
                store.stop()
    unit = "chunk" if args.streams else "request"
    for name, found in runs.items():
        figures = [run["us"] for run in found]
        shown = [round(f, 1) for f in figures]
        print(f"{name:6} median {statistics.median(figures):6.1f} µs a {unit}: {shown}")
    diffs = [a["us"] - b["us"] for b, a in zip(runs["before"], runs["after"], strict=True)]
    lower = sum(1 for d in diffs if d < 0)
    print(f"after - before, pair by pair: {[round(d, 1) for d in diffs]}")
    median = statistics.median(diffs)
    print(f"median {median:+.1f} µs a {unit}; after lower in {lower} of {len(diffs)}")
    if args.out:
        args.out.write_text(json.dumps({"unit": unit, "runs": runs, "diffs": diffs}, indent=1))


if __name__ == "__main__":
    main()

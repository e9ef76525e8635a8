"""Profile crossbar under the benchmark's load with py-spy.

    .venv/bin/pip install py-spy
    .venv/bin/python benchmarks/profiling.py wrk      [--seconds 20]
    .venv/bin/python benchmarks/profiling.py streams  [--seconds 20] [--k 500]
    .venv/bin/python benchmarks/profiling.py report --file STACKS.txt

Starts the fake upstream and crossbar as ``run.py`` does, puts the load on crossbar
(wrk POSTs, or K concurrent streams replaced as they end) and samples crossbar with
``py-spy record`` meanwhile. Writes the collapsed stacks and a flame graph to
``benchmarks/results/profile-<load>.{txt,svg}`` and prints the functions that cost most,
by own time and by inclusive time, as a share of crossbar's busy samples.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
import loads

REPO = str(Path(__file__).resolve().parent.parent)
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def short(frame: str) -> str:
    """``name (path:line)`` -> ``name (module path)``, shortened to the package."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    path = m.group("file")
    for marker in ("site-packages/", f"{REPO}/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('name')} ({path})"


AREAS = [
    # (area, pattern of a frame anywhere in the stack); the first match wins.
    ("log line (twisted.logger formatting + write)", r"^Logger\.emit "),
    ("metrics (request_done)", r"^Metrics\.request_done "),
    ("form parsing of the body (twisted.web _parseContentType)", r"^_parseContentType "),
    ("model peek (peek_model, with_model)", r"^(peek_model|with_model) "),
    ("host choice (choose, table snapshot)", r"^(choose|pick|best_group|HealthTable\.snapshot) "),
    ("header copying (upstream_headers, response headers)", r"^upstream_headers "),
    (
        "timers (callLater, cancel, reset, addTimeout)",
        r"^(ReactorBase\.callLater|DelayedCall\.|Deferred\.addTimeout|ReactorBase\._insertNewDelayedCalls)",
    ),
    ("epoll_ctl (start/stop reading or writing)", r"^EPollReactor\.(_add|_remove) "),
    ("send() to sockets", r"^Connection\.writeSomeData "),
    ("upstream request (pool, request head)", r"^(Upstreams\.request|Agent\.request) "),
    ("SSE chunk relay (decode upstream chunk, write to client)", r"^_StreamBody\.dataReceived "),
    (
        "upstream response head parsing",
        r"^(AnswerParser\.feed|HTTPClientParser\.dataReceived) ",
    ),
    ("client request parsing (HTTPChannel, Request)", r"^HTTPChannel\.dataReceived "),
    ("accept()", r"^Port\.doRead "),
    ("recv() and reactor dispatch", r"^Connection\.doRead "),
    ("epoll_wait and reactor loop", r"^EPollReactor\.doPoll "),
]


def samples(collapsed: Path) -> Iterator[tuple[list[str], int]]:
    """Each stack of py-spy's collapsed output: its Python frames (short names) and count."""
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if stack and count_text.isdigit():
            frames = [
                short(f)
                for f in stack.split(";")
                if not f.startswith(("process ", "thread ")) and not f.startswith('"')
            ]
            yield frames, int(count_text)


def areas(collapsed: Path) -> str:
    """Busy samples by area, each stack counted once, in the first area that matches."""
    rules = [(name, re.compile(pattern)) for name, pattern in AREAS]
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, count in samples(collapsed):
        total += count
        for name, rule in rules:
            if any(rule.search(f) for f in frames):
                counts[name] += count
                break
        else:
            counts["other"] += count
    lines = ["by area:"]
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in counts.most_common()]
    return "\n".join(lines)


def top(collapsed: Path, n: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, count in samples(collapsed):
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count
    lines = [f"{total} busy samples", "", "own time:"]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(n)]
    lines += ["", "inclusive time:"]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in inclusive.most_common(n)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("load", choices=["wrk", "streams", "report"])
    parser.add_argument("--file", type=Path, help="with report: collapsed stacks to summarize")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--k", type=int, default=500, help="concurrent streams (500)")
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--interval", type=float, default=20)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--crossbar-src",
        type=Path,
        default=None,
        help="profile the crossbar in this checkout",
    )
    parser.add_argument(
        "--features",
        action="store_true",
        help="profile the crossbar with keys, cache_affinity and the JSON log (the key is sent)",
    )
    args = parser.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        raise SystemExit("profiling.py: py-spy not found; pip install py-spy")
    if args.load == "report":
        print(areas(args.file))
        print()
        print(top(args.file, args.top))
        return
    harness.check_tools()
    settings = argparse.Namespace(
        backlog=None,
        workers=1,
        probe=False,
        gc_tune="",
        crossbar_src=args.crossbar_src,
        python=None,
        connections=64,
        threads=2,
        chunks=args.chunks,
        interval=args.interval,
        paths=("direct", "crossbar-features" if args.features else "crossbar"),
    )
    results = harness.HERE / "results"
    results.mkdir(exist_ok=True)
    name = f"profile-{args.load}{'-features' if args.features else ''}"
    raw = results / f"{name}.txt"
    svg = results / f"{name}.svg"
    with tempfile.TemporaryDirectory(prefix="crossbar-profile-") as tmp:
        bench = harness.Bench(settings, Path(tmp))
        with bench.running():
            path = "crossbar-features" if args.features else "crossbar"
            pid = bench.procs[path].pid
            url = bench.urls[path]
            key = harness.KEY if args.features else None
            loads.run_wrk(url, 1, 64, 2, key)  # warm up
            if args.load == "wrk":

                def load(seconds: float) -> None:
                    loads.run_wrk(url, seconds, 64, 2, key)
            else:

                def load(seconds: float) -> None:
                    out = loads.run_streams(
                        url, args.k, args.chunks, args.interval, duration=seconds
                    )
                    print(
                        f"streams: {out['completed']}/{out['started']} completed, "
                        f"{out['chunks']} chunks"
                    )

            worker = threading.Thread(target=load, args=(args.seconds + 2,))
            worker.start()
            common = ["--pid", str(pid), "--duration", f"{args.seconds:g}", "--rate"]
            common += [str(args.rate)]
            subprocess.run(
                [pyspy, "record", *common, "--format", "raw", "-o", str(raw)],
                check=True,
                capture_output=True,
            )
            worker.join()
            # A flame graph for people, from a second, shorter sampling.
            worker = threading.Thread(target=load, args=(7,))
            worker.start()
            subprocess.run(
                [pyspy, "record", "--pid", str(pid), "--duration", "5", "-o", str(svg)],
                check=True,
                capture_output=True,
            )
            worker.join()
    print(f"wrote {raw.relative_to(REPO)}, {svg.relative_to(REPO)}")
    print(areas(raw))
    print()
    print(top(raw, args.top))


if __name__ == "__main__":
    main()

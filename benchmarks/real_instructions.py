"""Instructions a real crossbar spends a streamed chunk and a stream: a count, not a time.

    .venv/bin/python benchmarks/real_instructions.py TREE [TREE...] [--streams 10]
                                                    [--short 100] [--long 400]

``instructions.py`` runs crossbar in memory; this runs each TREE (a dir holding a
``crossbar`` package: ``git archive REV crossbar twisted | tar -x -C DIR``) as
``twistd -n crossbar`` under ``valgrind --tool=callgrind``, on real sockets, in front of
``upstream.js``, and counts only while ``stream_client.js`` runs ``--streams`` streams of
``--short`` chunks, then of ``--long`` (20 ms apart, as ``ab.py``'s): the difference is a
chunk's instructions, what the short streams cost less their chunks a stream's own.
``ab.py``'s figure a chunk holds a share of each stream's own cost (a stream's request, its
usage read at the end); this one does not. Needs valgrind (``callgrind_control``) and node.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from harness import ROUTE, crossbar_config, crossbar_twistd, free_port, stop, wait_for
from loads import run_streams

HERE = Path(__file__).resolve().parent


def _counted(pid: int, out: Path, streams: int, chunks: int, url: str) -> int:
    """Instructions of ``pid`` while ``streams`` streams of ``chunks`` chunks run."""
    subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
    run_streams(url, streams, chunks, 20)
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        dumped = set(out.parent.glob(out.name + "*")) - before
        for path in dumped:
            found = re.search(r"^(?:totals|summary): (\d+)", path.read_text(errors="replace"), re.M)
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise SystemExit("real_instructions.py: callgrind wrote no dump")


def count(tree: Path, args: argparse.Namespace) -> tuple[float, float]:
    """A chunk's and a stream's own instructions in ``tree``'s crossbar."""
    with tempfile.TemporaryDirectory(prefix="crossbar-real-") as tmp:
        work = Path(tmp)
        upstream_port, port = free_port(), free_port()
        upstream = subprocess.Popen(
            ["node", str(HERE / "upstream.js"), str(upstream_port)], stdout=subprocess.DEVNULL
        )
        config, out = work / "crossbar.yaml", work / "callgrind.out"
        crossbar_config(config, port, upstream_port, None, 1)
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        command += [str(crossbar_twistd(None)), "-n", "--pidfile=", "crossbar"]
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        with open(work / "crossbar.log", "wb") as log:
            proc = subprocess.Popen(
                [*command, "--config", str(config)], cwd=work, env=env, stdout=log, stderr=log
            )
        try:
            url = f"http://127.0.0.1:{port}/{ROUTE}/v1/chat/completions"
            wait_for(f"http://127.0.0.1:{port}/{ROUTE}/v1/models", "crossbar", proc)
            run_streams(url, 5, 20, 10)  # warm: imports, pools, caches
            short = _counted(proc.pid, out, args.streams, args.short, url)
            long = _counted(proc.pid, out, args.streams, args.long, url)
        finally:
            stop(proc)
            stop(upstream)
    chunk = (long - short) / (args.streams * (args.long - args.short))
    return chunk, short / args.streams - chunk * args.short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--streams", type=int, default=10, help="streams at once (10)")
    parser.add_argument("--short", type=int, default=100, help="chunks a short stream (100)")
    parser.add_argument("--long", type=int, default=400, help="chunks a long stream (400)")
    args = parser.parse_args()
    for tree in args.trees:
        chunk, stream = count(tree, args)
        print(f"{tree}: {chunk:,.0f} instructions a chunk, {stream:,.0f} a stream's own")


if __name__ == "__main__":
    main()

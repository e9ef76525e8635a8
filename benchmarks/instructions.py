"""Instructions a request costs in crossbar's own process: a count, not a time.

    .venv/bin/python benchmarks/instructions.py TREE [TREE...] [--requests 300] [--plain]

On a shared machine a few per cent of CPU time is lost in the noise (``ab.py`` pairs
differ by ±100 µs). The instructions a request takes are the same run after run: each
TREE (a dir holding a ``crossbar`` package with ``crossbar.testing.MemoryProxy``) runs
``--requests`` keyed ``cache_affinity`` chat POSTs (``--plain``: an open ``priority``
route) through crossbar in memory (the site, the exchange, the upstream client, the
metrics, the recent and hourly windows, the access log and its JSON line; no sockets)
under ``valgrind --tool=callgrind``, counting only the requests' loop. Needs valgrind.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys


def measure(requests: int, plain: bool) -> None:
    """The loop callgrind counts (run inside ``functools.reduce``, its toggle)."""
    from twisted.logger import Logger

    from crossbar import logformat
    from crossbar.config import parse_config
    from crossbar.fleet import Observers, RecentTraffic
    from crossbar.fleet.hourly import HourlyTraffic
    from crossbar.pages.metrics import Metrics
    from crossbar.server.accesslog import AccessLog
    from crossbar.server.front import CLIENT_IDLE_TIMEOUT, guard_for
    from crossbar.testing import MemoryProxy

    key = "sk-bench-key-0123456789"
    route = {"hosts": ["upstream"], "default_model": "bench-model"}
    if not plain:
        route |= {"policy": "cache_affinity", "api_keys": [key]}
    config = parse_config(
        {"hosts": {"upstream": "http://127.0.0.1:18081"}, "routes": {"bench": route}}
    )
    proxy = MemoryProxy(config, models=("bench-model",))
    lines = Logger(namespace="crossbar.access", observer=logformat.json_line)
    try:  # the JSON log, as benchmarks/harness.py's --features config asks
        access = AccessLog(proxy.table.knows, lines, text=False)  # type: ignore[call-arg]
    except TypeError:  # a tree whose access log always made the line
        access = AccessLog(proxy.table.knows, lines)
    observers = Observers(
        Metrics(proxy.table, proxy.traffic, proxy.clock),
        RecentTraffic(config.hosts, proxy.clock, {}),
        HourlyTraffic(config.hosts, proxy.clock),
        access,
    )
    context = proxy.site.proxy.context  # type: ignore[union-attr]
    object.__setattr__(context, "observer", observers)
    site = proxy.site
    site._parsePOSTFormSubmission = False  # as crossbar's own sites
    site.guard, site.timeout = guard_for(config, "all"), CLIENT_IDLE_TIMEOUT
    body = b'{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}]}'
    auth = b"" if plain else b"Authorization: Bearer %s\r\n" % key.encode()
    head = b"POST /bench/v1/chat/completions HTTP/1.1\r\nHost: crossbar\r\n%s" % auth
    ask = head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    answer = (
        b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Hello."}}],'
        b'"usage":{"prompt_tokens":12,"completion_tokens":13,"total_tokens":25}}'
    )
    said = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    answered = said % len(answer) + answer
    client = proxy.client()
    client.send(ask)
    host = proxy.accept()
    host.send(answered)

    def one(_: object, __: object) -> None:
        client.transport.clear()
        host.transport.clear()
        client.send(ask)
        host.send(answered)

    for _ in range(100):  # warm: caches, first-time imports
        one(None, None)
    assert b"Hello." in client.transport.value(), client.transport.value()
    functools.reduce(one, range(requests), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        measure(args.requests, args.plain)
        return
    for tree in args.trees:
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no"]
        command += ["--toggle-collect=functools_reduce", "--callgrind-out-file=/dev/null"]
        command += [sys.executable, __file__, "--inside", "--requests", str(args.requests)]
        command += ["--plain"] if args.plain else []
        env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : ([\d,]+)", out.stderr)
        assert found is not None, out.stderr[-2000:]
        count = int(found.group(1).replace(",", "")) / args.requests
        print(f"{tree}: {count:,.0f} instructions a request")


if __name__ == "__main__":
    main()

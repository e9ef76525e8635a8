"""Instructions a request costs in crossbar's own process: a count, not a time.

    .venv/bin/python benchmarks/instructions.py TREE [TREE...] [--requests 300] [--plain]
                                               [--stream] [--chunks 50]

On a shared machine a few per cent of CPU time is lost in the noise (``ab.py`` pairs
differ by ±100 µs). The instructions a request takes are the same run after run: each
TREE (a dir holding a ``crossbar`` package, of any age: ``git archive REV crossbar |
tar -x -C DIR``) builds its whole service (``crossbar.service.Crossbar``: the site, the
exchange, the upstream client and every observer, with the JSON access log) on a
``MemoryReactorClock``, and runs ``--requests`` keyed ``cache_affinity`` chat POSTs
(``--plain``: an open ``priority`` route) through it, in memory, under ``valgrind
--tool=callgrind``, counting only the requests' loop. ``--stream``: each request is
answered with a stream of ``--chunks`` content events, a usage event and ``[DONE]``, and
the count is per stream. Needs valgrind.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KEY = "sk-bench-key-0123456789"
ANSWER = (
    b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Hello."}}],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":13,"total_tokens":25}}'
)
CONTENT = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" tok%d"}}],'
    b'"created":1764000000,"id":"chatcmpl-abc","model":"bench-model",'
    b'"object":"chat.completion.chunk","t":%d}\n\n'
)
USAGE = (
    b'data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1764000000,'
    b'"id":"chatcmpl-abc","model":"bench-model","object":"chat.completion.chunk",'
    b'"usage":{"completion_tokens":50,"prompt_tokens":12,"total_tokens":62},"timings":'
    b'{"cache_n":4,"prompt_n":8,"prompt_ms":5.1,"predicted_n":50,"predicted_per_second":144.3}}'
    b"\n\n"
)


def _framed(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def measure(requests: int, plain: bool, chunks: int | None) -> None:
    """The loop callgrind counts (run inside ``functools.reduce``, its toggle)."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.selectreactor import SelectReactor
    from twisted.internet.testing import MemoryReactorClock, StringTransport
    from twisted.logger import globalLogBeginner

    from crossbar import logformat
    from crossbar.config import parse_config
    from crossbar.service import Crossbar

    lines: list[str] = []
    globalLogBeginner.beginLoggingTo(
        [lambda event: lines.append(logformat.json_line(event) or "") or lines.clear()],
        discardBuffer=True,
        redirectStandardIO=False,
    )
    route: dict[str, object] = {"hosts": ["upstream"], "default_model": "bench-model"}
    if not plain:
        route |= {"policy": "cache_affinity", "api_keys": [KEY]}
    data = {
        "hosts": {"upstream": "http://127.0.0.1:18081"},
        "routes": {"bench": route},
        "log_format": "json",
    }
    folder = Path(tempfile.mkdtemp(prefix="crossbar-instructions-"))
    config = parse_config(data, str(folder / "crossbar.yaml"), folder)
    reactor = MemoryReactorClock()
    # Timers and the clock as a real reactor keeps them (a heap; ``time.time``, a C call),
    # not as ``Clock`` does (a list sorted by a Python key at each call, a Python method):
    # a never-run reactor's, its due calls run once a request as its loop would.
    timers = SelectReactor()
    reactor.callLater = timers.callLater  # type: ignore[method-assign]
    reactor.seconds = timers.seconds  # type: ignore[method-assign]
    reactor.getDelayedCalls = timers.getDelayedCalls  # type: ignore[method-assign]
    service = Crossbar(config, reactor)
    service.table.record_ok("upstream", ("bench-model",), ("bench-model",))
    client = IPv4Address("TCP", "127.0.0.1", 40000)
    channel = service.site.buildProtocol(client)
    to_client = StringTransport(peerAddress=client)
    channel.makeConnection(to_client)

    stream = b',"stream":true' if chunks is not None else b""
    body = b'{"model":"bench-model"%s,"messages":[{"role":"user","content":"Hi."}]}' % stream
    auth = b"" if plain else b"Authorization: Bearer %s\r\n" % KEY.encode()
    head = b"POST /bench/v1/chat/completions HTTP/1.1\r\nHost: crossbar\r\n%s" % auth
    ask = head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    if chunks is None:
        said = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        answer = [said % len(ANSWER) + ANSWER]
    else:
        answer = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"]
        answer[0] += b"Transfer-Encoding: chunked\r\n\r\n"
        answer += [_framed(CONTENT % (i, i)) for i in range(chunks)]
        answer += [_framed(USAGE), _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"]

    channel.dataReceived(ask)
    address, port, factory, *_ = reactor.tcpClients[0]
    host = factory.buildProtocol(IPv4Address("TCP", address, port))
    to_host = StringTransport(peerAddress=IPv4Address("TCP", address, port))
    host.makeConnection(to_host)

    def one(_: object, __: object) -> None:
        to_client.clear()
        to_host.clear()
        channel.dataReceived(ask)
        for piece in answer:
            host.dataReceived(piece)
        timers.runUntilCurrent()

    for piece in answer:
        host.dataReceived(piece)
    for _ in range(100):  # warm: caches, first-time imports
        one(None, None)
    assert to_client.value().startswith(b"HTTP/1.1 200"), to_client.value()[:200]
    assert len(reactor.tcpClients) == 1, "the host's connection was not kept alive"
    gc.collect()
    gc.freeze()  # as crossbar's own start does
    functools.reduce(one, range(requests), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--plain", action="store_true", help="an open priority route")
    parser.add_argument("--stream", action="store_true", help="streamed answers")
    parser.add_argument("--chunks", type=int, default=50, help="content events a stream")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chunks = args.chunks if args.stream else None
    if args.inside:
        measure(args.requests, args.plain, chunks)
        return
    for tree in args.trees:
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no"]
        command += ["--toggle-collect=functools_reduce", "--callgrind-out-file=/dev/null"]
        command += [sys.executable, __file__, "--inside", "--requests", str(args.requests)]
        command += ["--plain"] if args.plain else []
        command += ["--stream", "--chunks", str(args.chunks)] if args.stream else []
        env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : ([\d,]+)", out.stderr)
        assert found is not None, out.stderr[-2000:]
        count = int(found.group(1).replace(",", "")) / args.requests
        what = f"a stream of {args.chunks} chunks" if args.stream else "a request"
        print(f"{tree}: {count:,.0f} instructions {what}", flush=True)


if __name__ == "__main__":
    main()

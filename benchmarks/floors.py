"""What one request costs before crossbar does anything: the floors under its CPU figure.

    .venv/bin/python benchmarks/floors.py [--rounds 2] [--seconds 5]

Runs the benchmark's ``wrk`` load (``post.lua``, 64 connections) against two servers in
one Python process each, on the loop crossbar runs (``crossbar._twisted.run_lean``), that
answer every POST with the same small JSON body and forward nothing:

- ``twisted.web``: a ``Site`` with one leaf resource, no access log and no form parsing
  (``parsePOSTFormSubmission=False``, as crossbar's site): what twisted.web's server side
  costs a request;
- ``protocol``: a bare Twisted ``Protocol`` that answers each read with the whole answer
  and parses nothing (each of ``wrk``'s requests comes in one read): the system calls and
  the reactor alone.

Prints CPU per request (user and system, from ``/proc/<pid>/stat``) for each, alternating.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BODY = (
    b'{"id":"x","object":"chat.completion","choices":'
    b'[{"index":0,"message":{"role":"assistant","content":"Hello."}}]}'
)


def serve(kind: str, port: int) -> None:
    """The server of ``kind``, on 127.0.0.1:``port``, until killed."""
    sys.path.insert(0, str(HERE.parent))
    from twisted.internet import protocol, reactor
    from twisted.web import resource, server

    from crossbar._twisted import run_lean

    class Leaf(resource.Resource):
        isLeaf = True

        def render_POST(self, request: server.Request) -> bytes:
            request.setHeader(b"content-type", b"application/json")
            return BODY

        render_GET = render_POST  # for the readiness check

    class Bare(protocol.Protocol):
        answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(BODY), BODY)
        )

        def dataReceived(self, data: bytes) -> None:
            assert self.transport is not None
            self.transport.write(self.answer)

    factory: Any
    if kind == "twisted.web":
        factory = server.Site(Leaf(), parsePOSTFormSubmission=False)
        factory.log = lambda request: None  # no access log
    else:
        factory = protocol.Factory.forProtocol(Bare)
    reactor.listenTCP(port, factory, backlog=1024, interface="127.0.0.1")  # type: ignore[attr-defined]
    run_lean(reactor)
    reactor.run()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both servers (2)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds per wrk run (5)")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    from ab import user_system
    from harness import free_port, stop, wait_for
    from loads import run_wrk
    from procstat import CLK_TCK

    for _ in range(args.rounds):
        for kind in ("twisted.web", "protocol"):
            port = free_port()
            proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port)])
            try:
                url = f"http://127.0.0.1:{port}/bench/v1/chat/completions"
                wait_for(url, kind, proc)
                run_wrk(url, 1, 64, 2)  # warm
                before = user_system(proc.pid)
                result = run_wrk(url, args.seconds, 64, 2)
                after = user_system(proc.pid)
            finally:
                stop(proc)
            n = result["requests"]
            user = (after[0] - before[0]) * 1e6 / CLK_TCK / n
            system = (after[1] - before[1]) * 1e6 / CLK_TCK / n
            rate = n / (result["duration_us"] / 1e6)
            print(
                f"{kind:12} {rate:9,.0f} req/s  {user + system:5.1f} µs a request "
                f"(user {user:4.1f}, system {system:4.1f})",
                flush=True,
            )
            time.sleep(0.5)


if __name__ == "__main__":
    main()

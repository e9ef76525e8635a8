"""The reactor's longest turns while a host sends a new 8 MiB model list on every poll:
read in place against read by a child process (``crossbar.polling.listreader``), side by
side in one run:

    .venv/bin/python benchmarks/listpolls.py [--seconds 10] [--ids 520000]

The host is a plain HTTP server in a process of its own, alternating two lists of
``--ids`` six-digit ids (16 bytes an entry: 520,000 fill 8 MiB). The poller asks it every
0.2 s and reads every list anew (the once-a-minute limit on re-reading long lists is
lifted for the run). A 1 ms ``LoopingCall`` records how late each turn came: what a
request arriving then would have waited. Prints, per way of reading: the polls made, and
the reactor's 99th percentile and longest delay.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from treq.client import HTTPClient  # noqa: E402
from twisted.internet import reactor, task  # noqa: E402
from twisted.internet.defer import Deferred  # noqa: E402
from twisted.web.client import Agent  # noqa: E402

from crossbar.config import HostSettings  # noqa: E402
from crossbar.polling import poller as poller_module  # noqa: E402
from crossbar.polling.health import HealthTable  # noqa: E402
from crossbar.polling.listreader import ListReader  # noqa: E402
from crossbar.polling.poller import Poller  # noqa: E402

HOST = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    ids = int(sys.argv[1])
    base = b'{"object":"list","data":[' + b",".join(b'{"id":"%06d"}' % i for i in range(ids))
    lists = [base + b"]}", base.replace(b'"0', b'"9', 1) + b"]}"]
    served = [0]
    class Host(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def do_GET(self):
            body = b'{"status":"ok"}'
            if self.path == "/v1/models":
                served[0] += 1
                body = lists[served[0] % 2]
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Host)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)


async def run(url: str, aside: bool, seconds: float) -> tuple[int, float, float]:
    settings = {"host": HostSettings(poll_interval=0.2, poll_timeout=10.0)}
    table = HealthTable({"host": url}, reactor, settings)
    read = ListReader(reactor, reactor).read if aside else None
    poller = Poller(table, HTTPClient(Agent(reactor)), reactor, read=read)
    delays: list[float] = []
    last = time.perf_counter()

    def turn() -> None:
        nonlocal last
        now = time.perf_counter()
        delays.append(now - last - 0.001)
        last = now

    loop = task.LoopingCall(turn)
    loop.start(0.001)
    poller.startService()
    await task.deferLater(reactor, seconds, lambda: None)
    loop.stop()
    await poller.stopService()
    state = table.get("host")
    assert state is not None and state.healthy, state
    delays.sort()
    return state.polls, delays[int(len(delays) * 0.99)] * 1000, delays[-1] * 1000


async def main(args: argparse.Namespace) -> None:
    poller_module.REREAD_SECONDS = 0.0
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(args.ids)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert host.stdout is not None
        url = f"http://127.0.0.1:{host.stdout.readline().strip()}"
        print(f"a new list of {args.ids:,} ids on every poll, every 0.2 s, {args.seconds:g} s each")
        print(f"{'read':<10} {'polls':>6} {'p99 delay':>10} {'longest':>10}")
        for aside in (False, True, False, True):
            polls, p99, worst = await run(url, aside, args.seconds)
            name = "aside" if aside else "in place"
            print(f"{name:<10} {polls:>6} {p99:>8.1f}ms {worst:>8.1f}ms")
    finally:
        host.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ids", type=int, default=520_000)
    done: Deferred[None] = Deferred.fromCoroutine(main(parser.parse_args()))
    done.addErrback(lambda f: f.printTraceback())
    done.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]

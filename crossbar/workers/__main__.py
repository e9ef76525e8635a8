"""``python -m crossbar.workers``: one extra worker, started by worker 0."""

from __future__ import annotations

import os
import signal
from typing import Any

from zope.interface import implementer


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - runs in a child
    """Run one extra worker until SIGTERM, or until the twistd process is gone."""
    import argparse

    from twisted.internet import reactor, task
    from twisted.logger import ILogObserver, formatEvent, globalLogBeginner

    from crossbar.config import ConfigError, load_config
    from crossbar.pages.peers import WorkerInfo
    from crossbar.service import Crossbar

    parser = argparse.ArgumentParser(prog="python -m crossbar.workers")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        text = formatEvent(event)
        if text and not event.get("log_namespace", "").startswith("twisted"):
            print(text, flush=True)

    globalLogBeginner.beginLoggingTo([observe], redirectStandardIO=False)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"crossbar: {e}", flush=True)
        raise SystemExit(2) from None
    info = WorkerInfo(args.index, args.count, args.run_dir)
    crossbar = Crossbar(config, reactor, worker=info)
    parent = os.getppid()

    def orphaned() -> None:
        if os.getppid() != parent:
            reactor.stop()  # type: ignore[attr-defined]

    watch = task.LoopingCall(orphaned)
    reactor.callWhenRunning(crossbar.startService)  # type: ignore[attr-defined]
    reactor.callWhenRunning(watch.start, 1.0, now=False)  # type: ignore[attr-defined]
    reactor.addSystemEventTrigger("before", "shutdown", crossbar.stopService)  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to twistd, which stops us
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()

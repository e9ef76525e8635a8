"""``python -m crossbar.workers``: one extra worker, started by worker 0.

Its log goes to stdout as plain lines: worker 0 logs each one with its own timestamp
and the worker's name in front, so the child adds neither.
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

from twisted.logger import ILogObserver, LogLevel, PredicateResult, eventAsText
from zope.interface import implementer

from crossbar._twisted import run_lean
from crossbar.http import not_an_internal_start
from crossbar.logformat import json_line


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - runs in a child
    """Run one extra worker until SIGTERM, or until the twistd process is gone."""
    from twisted.internet import reactor, task
    from twisted.logger import globalLogBeginner

    from crossbar.config import ConfigError, load_config
    from crossbar.pages import WorkerInfo
    from crossbar.service import Crossbar

    args = parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"crossbar: {e}", flush=True)
        raise SystemExit(2) from None
    observer = print_json if config.log_format == "json" else print_event
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    run_lean(reactor)
    info = WorkerInfo(args.index, args.count, args.run_dir)
    crossbar = Crossbar(config, reactor, worker=info, load=lambda: load_config(args.config))
    parent = os.getppid()

    def reload(signum: int, frame: object) -> None:
        reactor.callFromThread(crossbar.reload)  # type: ignore[attr-defined]

    def orphaned() -> None:
        if os.getppid() != parent:
            reactor.stop()  # type: ignore[attr-defined]

    watch = task.LoopingCall(orphaned)
    reactor.callWhenRunning(crossbar.startService)  # type: ignore[attr-defined]
    reactor.callWhenRunning(watch.start, 1.0, now=False)  # type: ignore[attr-defined]
    reactor.addSystemEventTrigger("before", "shutdown", crossbar.stopService)  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to twistd, which stops us
    signal.signal(signal.SIGHUP, reload)  # sent by worker 0, which reloads first
    reactor.run()  # type: ignore[attr-defined]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m crossbar.workers")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    return parser.parse_args(argv)


@implementer(ILogObserver)
def print_json(event: dict[str, Any]) -> None:
    """Print one log event as one JSON object (``log_format: json``): worker 0 hands it
    on whole, with this worker's name added."""
    if _left_out(event):
        return
    line = json_line(event)
    if line:
        print(line, end="", flush=True)


def _left_out(event: dict[str, Any]) -> bool:
    """Twisted's own informational lines, and internal ports' "starting on" lines."""
    chatter = event.get("log_level", LogLevel.info) < LogLevel.warn
    if chatter and event.get("log_namespace", "").startswith("twisted"):
        return True
    return not_an_internal_start(event) is PredicateResult.no


@implementer(ILogObserver)
def print_event(event: dict[str, Any]) -> None:
    """Print one log event, with its traceback if it has one.

    Twisted's own informational lines are left out, but not its warnings and errors
    (an unhandled error in a Deferred, say), and so are the "starting on" lines of
    internal ports, as twistd's log leaves them out for worker 0.
    """
    if _left_out(event):
        return
    text = eventAsText(event, includeTimestamp=False, includeSystem=False).rstrip()
    if text:
        print(text, flush=True)


if __name__ == "__main__":
    main()

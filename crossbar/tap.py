"""``twistd crossbar``: command-line options and the service they make."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from crossbar.config import Config, ConfigError, load_config, parse_listen


class Options(usage.Options):
    synopsis = "[--config crossbar.yaml | --demo [--listen 7777]]"
    longdesc = "Route OpenAI-style requests to a fleet of llama-server hosts, model-aware."
    optParameters = [
        ["config", "c", "crossbar.yaml", "Path to the configuration file."],
        ["listen", "l", "7777", "With --demo: the port or endpoint to listen on."],
    ]
    optFlags = [["demo", None, "Run in front of a simulated fleet on loopback (no GPU needed)."]]


def makeService(options: Options) -> IService:
    from twisted.internet import reactor

    from crossbar.service import Crossbar

    try:
        if options["demo"]:
            from crossbar.demo import demo_config

            try:
                listen = parse_listen(options["listen"])
            except ValueError as e:
                raise ConfigError("--listen", "", str(e)) from None
            config, _ = demo_config(reactor, listen)
        else:
            config = load_config(options["config"])
    except ConfigError as e:
        # One line naming file, key and problem; never a traceback.
        print(f"crossbar: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    reactor.callWhenRunning(_stop_cleanly_on_signals, reactor)
    if config.workers == 1:
        return Crossbar(config, reactor)
    return _with_workers(config, options["config"], reactor)


def _with_workers(config: Config, path: str, reactor: Any) -> IService:
    """Worker 0 in this process, workers 1..N-1 as children sharing its port."""
    import shutil
    import tempfile

    from twisted.application.service import MultiService

    from crossbar.pages.peers import WorkerInfo
    from crossbar.service import Crossbar
    from crossbar.workers import WorkerProcesses

    run_dir = tempfile.mkdtemp(prefix="crossbar-workers-")
    reactor.addSystemEventTrigger("after", "shutdown", shutil.rmtree, run_dir, True)
    info = WorkerInfo(0, config.workers, run_dir)
    top = MultiService()
    Crossbar(config, reactor, worker=info).setServiceParent(top)
    WorkerProcesses(reactor, str(Path(path).resolve()), info).setServiceParent(top)
    return top


def _stop_cleanly_on_signals(reactor: Any) -> None:
    """Make SIGTERM and Ctrl-C a clean stop with exit code 0.

    twistd's own handlers re-raise the signal after shutting down, so a service
    manager would see a kill, not a clean stop.
    """

    def stop(signum: int, frame: object) -> None:
        reactor.callFromThread(reactor.stop)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

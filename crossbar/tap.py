"""``twistd crossbar``: command-line options and the service they make."""

from __future__ import annotations

import signal
import sys
from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from crossbar.config import ConfigError, load_config, parse_listen


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
    return Crossbar(config, reactor)


def _stop_cleanly_on_signals(reactor: Any) -> None:
    """Make SIGTERM and Ctrl-C a clean stop with exit code 0.

    twistd's own handlers re-raise the signal after shutting down, so a service
    manager would see a kill, not a clean stop.
    """

    def stop(signum: int, frame: object) -> None:
        reactor.callFromThread(reactor.stop)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

"""``twistd crossbar``: command-line options and the service they make."""

from __future__ import annotations

import sys

from twisted.application.service import IService
from twisted.python import usage

from crossbar.config import ConfigError, load_config


class Options(usage.Options):
    synopsis = "[--config crossbar.yaml]"
    longdesc = "Route OpenAI-style requests to a fleet of llama-server hosts, model-aware."
    optParameters = [["config", "c", "crossbar.yaml", "Path to the configuration file."]]


def makeService(options: Options) -> IService:
    from twisted.internet import reactor

    from crossbar.service import Crossbar

    try:
        config = load_config(options["config"])
    except ConfigError as e:
        # One line naming file, key and problem; never a traceback.
        print(f"crossbar: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return Crossbar(config, reactor)

"""``twistd crossbar``: command-line options and the service they make."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
from twisted.application.service import IService, IServiceCollection, MultiService
from twisted.logger import FilteringLogObserver, ILogObserver
from twisted.python import usage
from twisted.python.components import Componentized

from crossbar import __version__
from crossbar._twisted import run_lean, twistd_log_observer
from crossbar.config import Config, ConfigError, load_config, parse_listen, to_yaml
from crossbar.http import CannotListen, not_an_internal_start
from crossbar.logformat import writer

if TYPE_CHECKING:
    from crossbar.service import Crossbar
    from crossbar.workers import WorkerProcesses


class Options(usage.Options):
    synopsis = "[--config crossbar.yaml | --demo [--listen 7777]] [--check]"
    longdesc = "Route OpenAI-style requests to a fleet of llama-server hosts, model-aware."
    optParameters = [
        ["config", "c", "crossbar.yaml", "Path to the configuration file."],
        [
            "listen",
            "l",
            None,
            "Port or Twisted endpoint to listen on: overrides the config file's listen "
            "(7777 with --demo).",
        ],
    ]
    optFlags = [
        ["demo", None, "Run in front of a simulated fleet on loopback (no GPU needed)."],
        [
            "check",
            None,
            "Check the config, print it with every default filled in and keys masked, and "
            "exit without starting: 0, or 2 with the error.",
        ],
    ]

    def opt_version(self) -> NoReturn:
        """Print crossbar's version and exit (twistd's own ``--version`` prints Twisted's)."""
        print(f"crossbar {__version__}")
        sys.exit(0)


def makeService(options: Options) -> IService:
    from twisted.internet import reactor

    from crossbar.service import Crossbar

    load: Callable[[], Config] | None = None
    try:
        listen = _listen(options["listen"])
        if options["demo"] and options["check"]:
            from crossbar.demo import FLEET, fleet_config

            # The simulated hosts listen on ports chosen at start: none is started here.
            urls = {name: "http://127.0.0.1" for name in FLEET}
            config = fleet_config(listen or parse_listen(7777), urls)
        elif options["demo"]:
            from crossbar.demo import demo_config

            config, _ = demo_config(reactor, listen or parse_listen(7777))
        else:
            load = _loader(options["config"], listen)
            config = load()
    except ConfigError as e:
        _fail(str(e), 2)  # one line naming file, key and problem; never a traceback
    if options["check"]:
        _show(config)
    reactor.callWhenRunning(_stop_cleanly_on_signals, reactor)
    run_lean(reactor)
    log = _log_observer(options, config, reactor)
    if config.workers == 1:
        crossbar = Crossbar(config, reactor, load=load)
        reactor.callWhenRunning(_reload_on_sighup, reactor, crossbar)
        return _OneLineErrors(log, crossbar)
    crossbar, workers = _with_workers(config, options["config"], reactor, load)
    crossbar.siblings = workers.reload
    reactor.callWhenRunning(_reload_on_sighup, reactor, crossbar)
    return _OneLineErrors(log, crossbar, workers)


def _loader(path: str, listen: str | None) -> Callable[[], Config]:
    """Reads the config file, at start and for each reload, with ``--listen`` applied."""

    def load() -> Config:
        config = load_config(path)
        if listen is None:
            return config
        if config.workers > 1:
            raise ConfigError("--listen", "", "cannot be used with workers: set listen in the file")
        return attrs.evolve(config, listen=listen)

    return load


def _log_observer(options: Options, config: Config, reactor: Any) -> ILogObserver | None:
    """twistd's own log observer (as its --logfile, --syslog and -n say), without the lines
    of crossbar's internal ports, writing JSON with ``log_format: json`` and a file's lines
    in batches while ``reactor`` runs; ``None`` when not run by twistd."""
    parent = getattr(options, "parent", None)
    if parent is None:
        return None
    observer = writer(twistd_log_observer(parent), config.log_format, reactor)
    return FilteringLogObserver(observer, [not_an_internal_start])


def _listen(value: str | None) -> str | None:
    try:
        return None if value is None else parse_listen(value)
    except ValueError as e:
        raise ConfigError("--listen", "", str(e)) from None


def _show(config: Config) -> NoReturn:
    """``--check``: the effective config on the terminal's stdout, before twistd logs,
    writes a pid file or runs the reactor; then exit 0."""
    print(to_yaml(config), end="", file=sys.__stdout__ or sys.stdout, flush=True)
    raise SystemExit(0)


def _fail(message: str, code: int) -> NoReturn:
    """One line on the terminal's stderr (twistd may have sent ``sys.stderr`` into its
    log by now), then the exit code."""
    print(f"crossbar: {message}", file=sys.__stderr__ or sys.stderr, flush=True)
    raise SystemExit(code)


class _OneLineErrors(MultiService):
    """Under twistd: a port that cannot be opened stops start-up with one line and a
    non-zero exit code, not twistd's traceback; and the log goes through ``log``."""

    def __init__(self, log: ILogObserver | None, *services: IService) -> None:
        super().__init__()
        for service in services:
            service.setServiceParent(self)
        self._log = log

    def setServiceParent(self, parent: IServiceCollection) -> None:
        super().setServiceParent(parent)
        # twistd logs to the application's ILogObserver when it has one.
        if (
            self._log is not None
            and isinstance(parent, Componentized)
            and parent.getComponent(ILogObserver, None) is None
        ):
            parent.setComponent(ILogObserver, self._log)

    def startService(self) -> None:
        try:
            super().startService()
        except CannotListen as e:
            _fail(str(e), 1)


def _with_workers(
    config: Config, path: str, reactor: Any, load: Callable[[], Config] | None
) -> tuple[Crossbar, WorkerProcesses]:
    """Worker 0 in this process, workers 1..N-1 as children sharing its port."""
    import shutil
    import tempfile

    from crossbar.pages import WorkerInfo, peer_secret
    from crossbar.service import Crossbar
    from crossbar.workers import WorkerProcesses

    run_dir = tempfile.mkdtemp(prefix="crossbar-workers-")
    reactor.addSystemEventTrigger("after", "shutdown", shutil.rmtree, run_dir, True)
    info = WorkerInfo(0, config.workers, run_dir)
    peer_secret(info)  # made now, mode 0600, before any port opens or worker starts
    return Crossbar(config, reactor, worker=info, load=load), WorkerProcesses(
        reactor, str(Path(path).resolve()), info, config.drain_timeout
    )


def _reload_on_sighup(reactor: Any, crossbar: Crossbar) -> None:
    """SIGHUP reloads the config (every worker's, with workers), as systemd's
    ``ExecReload`` and ``kill -HUP`` expect."""

    def reload(signum: int, frame: object) -> None:
        reactor.callFromThread(crossbar.reload_everywhere)

    signal.signal(signal.SIGHUP, reload)


def _stop_cleanly_on_signals(reactor: Any) -> None:
    """Make SIGTERM and Ctrl-C a clean stop with exit code 0.

    twistd's own handlers re-raise the signal after shutting down, so a service
    manager would see a kill, not a clean stop.
    """

    def stop(signum: int, frame: object) -> None:
        reactor.callFromThread(reactor.stop)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

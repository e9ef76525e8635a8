"""Fixtures for integration tests against real llama.cpp ``llama-server`` routers.

Run them (they are marked ``integration`` and left out of a plain ``pytest`` run)::

    pip install '.[test,integration]'
    bash scripts/llama-server.sh          # once: builds and caches llama-server (~10 min)
    pytest -m integration tests/integration

About a minute and a half on two cores once the binary is cached: the longest test watches
crossbar poll two routers for a minute, and the others run while it waits.

Everything in this folder needs the real binary, built (once, about ten minutes on two cores,
then cached outside the repository) by ``scripts/llama-server.sh``, and tiny random-weight models
written by ``scripts/tiny_models.py`` (needs ``pip install gguf==0.19.0``). When either is not
available the tests here are skipped with the reason, unless ``CROSSBAR_REQUIRE_INTEGRATION`` is
set to a non-empty value: then they fail, so CI cannot pass by skipping them.

Set ``CROSSBAR_LLAMA_SERVER=/path/to/llama-server`` to use a binary of your own instead of the
script's.

Fixtures:

``llama_server_bin``
    Path of the ``llama-server`` binary (session).
``tiny_models``
    ``tiny_models("tiny-a", "tiny-b") -> Path``: a new folder holding those models, for one
    router's ``--models-dir``. Model ids are the names. Session-scoped: every call makes a new
    folder, so fixtures of any scope can use it.
``llama_router`` / ``module_llama_router``
    ``llama_router(models_dir, models_max=2, extra_args=(), port=None) -> RouterProcess``: a real
    router on a free 127.0.0.1 port (or on ``port``), ready (``/health`` answered 200).
    ``llama_router.restart(router)`` stops it and starts it again on the same port with the same
    models. Stopped at teardown of the test (or of the module), children too.
``crossbar_process`` / ``module_crossbar_process``
    ``crossbar_process(config_dict) -> CrossbarProcess``: crossbar itself under
    ``twistd -n --pidfile= crossbar -c crossbar.yaml`` in a new folder, with the dict written as
    YAML; ``listen`` is filled in with a free port when missing. Ready when its port accepts
    connections. Stopped at teardown of the test (or of the module).

Both kinds of process are :class:`tests.support.Daemon` s, started and stopped the way the
unit tests start crossbar: in a session of their own, so that nothing they spawn outlives
the test.

Example::

    @pytest.mark.integration
    def test_something(tiny_models, llama_router, crossbar_process):
        a = llama_router(tiny_models("tiny-a", "tiny-b"))
        b = llama_router(tiny_models("tiny-b", "tiny-c"))
        proxy = crossbar_process({
            "poll_interval": "250ms",
            "hosts": {"gpu-a": a.url, "gpu-b": b.url},
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "tiny-a"}},
        })
        ...  # talk to proxy.url

The fixtures are synchronous (plain sockets and ``urllib`` while waiting for readiness), so they
work from ordinary tests and from ``pytest_twisted.inlineCallbacks`` / ``ensureDeferred`` tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs
import pytest
import yaml

from tests.support import REPO, Daemon, free_port, http_status, start_daemon

BUILD_SCRIPT = REPO / "scripts" / "llama-server.sh"
TINY_MODELS_SCRIPT = REPO / "scripts" / "tiny_models.py"

REQUIRE_ENV = "CROSSBAR_REQUIRE_INTEGRATION"
BINARY_ENV = "CROSSBAR_LLAMA_SERVER"

# Bounds of every wait here; a first build of llama-server takes about ten minutes.
BUILD_TIMEOUT = 60 * 60.0
ROUTER_READY_TIMEOUT = 30.0
START_ATTEMPTS = 3

CrossbarProcess = Daemon
"""A running crossbar (``twistd -n crossbar``; twistd logs to stdout)."""


def _unavailable(reason: str) -> NoReturn:
    """Skip (or, when integration tests are required, fail) because a prerequisite is missing."""
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(f"integration prerequisites missing: {reason}")


def _healthy(url: str) -> Callable[[], bool]:
    """A check that the server at ``url`` answers ``/health`` with 200."""
    return lambda: http_status(f"{url}/health", timeout=0.5) == 200


# --------------------------------------------------------------------------------------------
# The binary and the models
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The real ``llama-server``: $CROSSBAR_LLAMA_SERVER, or built/cached by the script."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            _unavailable(f"{BINARY_ENV}={override} is not an executable file")
        return path
    if shutil.which("bash") is None:
        _unavailable("bash is needed to run scripts/llama-server.sh")
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        _unavailable(f"scripts/llama-server.sh did not finish within {BUILD_TIMEOUT:.0f} s")
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        err = "\n".join(done.stderr.decode(errors="replace").strip().splitlines()[-20:])
        _unavailable(f"scripts/llama-server.sh failed (exit {done.returncode}):\n{err}")
    path = Path(lines[-1])
    if not (path.is_file() and os.access(path, os.X_OK)):
        _unavailable(f"scripts/llama-server.sh printed {path}, which is not an executable file")
    return path


@pytest.fixture(autouse=True)
def _integration_prerequisites(llama_server_bin: Path) -> None:
    """Every test in this folder needs the binary: skip (or fail) them all the same way."""


@pytest.fixture(scope="session")
def _tiny_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session folder where each tiny model is generated once."""
    return tmp_path_factory.mktemp("tiny-model-cache")


@pytest.fixture(scope="session")
def tiny_models(
    _tiny_model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Path]:
    """``tiny_models(*names) -> Path``: a fresh folder with ``NAME.gguf`` for each name.

    Models are generated by ``scripts/tiny_models.py`` (same name, same weights) and copied, so
    each router can get a folder of its own that a test may change (add, remove, corrupt files).
    Every call makes a new folder, so one factory serves tests and fixtures of any scope.
    """

    def make(*names: str) -> Path:
        missing = [n for n in names if not (_tiny_model_cache / f"{n}.gguf").exists()]
        if missing:
            done = subprocess.run(
                [sys.executable, str(TINY_MODELS_SCRIPT), str(_tiny_model_cache), *missing],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                _unavailable(
                    "scripts/tiny_models.py failed (is gguf==0.19.0 installed?):\n"
                    + done.stderr.decode(errors="replace").strip()
                )
        folder = tmp_path_factory.mktemp("models")
        for name in names:
            shutil.copyfile(_tiny_model_cache / f"{name}.gguf", folder / f"{name}.gguf")
        return folder

    return make


# --------------------------------------------------------------------------------------------
# Real llama-server routers
# --------------------------------------------------------------------------------------------


@attrs.define
class RouterProcess(Daemon):
    """A running ``llama-server`` in router mode, and how to start it again."""

    models_dir: Path = Path()
    models_max: int = 2
    extra_args: tuple[str, ...] = ()


class RouterStarter:
    """Starts real routers and remembers them, so whoever owns it can stop them all."""

    def __init__(self, binary: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.binary = binary
        self.tmp_path_factory = tmp_path_factory
        self.started: list[RouterProcess] = []

    def __call__(
        self,
        models_dir: Path,
        *,
        models_max: int = 2,
        extra_args: Sequence[str] = (),
        port: int | None = None,
    ) -> RouterProcess:
        workdir = self.tmp_path_factory.mktemp("router")
        cache = workdir / "llama-cache"
        cache.mkdir()
        env = dict(os.environ, LLAMA_CACHE=str(cache))
        env.pop("LLAMA_ARG_MODELS_DIR", None)
        problem = ""
        for attempt in range(1, START_ATTEMPTS + 1):
            # A given port is retried as it is (it may still be held for a moment by the router
            # that used it before); otherwise another free one is picked.
            number = free_port() if port is None else port
            args = [
                str(self.binary),
                "--models-dir", str(models_dir),
                "--host", "127.0.0.1",
                "--port", str(number),
                "--models-max", str(models_max),
                *extra_args,
            ]  # fmt: skip
            router = RouterProcess.start(
                args,
                number,
                workdir / f"router-{attempt}.log",
                cwd=workdir,
                env=env,
                models_dir=models_dir,
                models_max=models_max,
                extra_args=tuple(extra_args),
            )
            self.started.append(router)
            if router.wait(_healthy(router.url), ROUTER_READY_TIMEOUT):
                return router
            code = router.stop()
            problem = (
                f"exited with {code}"
                if code not in (-signal.SIGTERM, -signal.SIGKILL)
                else f"no 200 from /health within {ROUTER_READY_TIMEOUT:.0f} s"
            )
            problem += f"; log:\n{router.log()}"
            if port is not None:
                time.sleep(0.5)
        pytest.fail(f"llama-server router did not start: {problem}", pytrace=False)

    def restart(self, router: RouterProcess) -> RouterProcess:
        """Stop ``router`` if it still runs, and start a new one like it on the same port."""
        router.stop()
        return self(
            router.models_dir,
            models_max=router.models_max,
            extra_args=router.extra_args,
            port=router.port,
        )

    def stop_all(self) -> None:
        for router in self.started:
            router.stop()


@pytest.fixture
def llama_router(
    llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterStarter]:
    """Factory: ``llama_router(models_dir, models_max=2, extra_args=(), port=None)``.

    Starts ``llama-server --models-dir DIR --host 127.0.0.1 --port P --models-max N`` with
    ``LLAMA_CACHE`` pointing at an empty folder (so no cached models of this machine show up),
    and returns a :class:`RouterProcess` once ``/health`` answers 200. ``port`` asks for a given
    port (to bring a stopped router back where it was); ``llama_router.restart(router)`` does
    exactly that. Every router is stopped at teardown.
    """
    starter = RouterStarter(llama_server_bin, tmp_path_factory)
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def module_llama_router(
    llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterStarter]:
    """``llama_router`` for module-scoped fixtures: routers live until the module is done."""
    starter = RouterStarter(llama_server_bin, tmp_path_factory)
    yield starter
    starter.stop_all()


# --------------------------------------------------------------------------------------------
# crossbar itself
# --------------------------------------------------------------------------------------------


class CrossbarStarter:
    """Starts crossbar processes and remembers them, so whoever owns it can stop them all."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.started: list[CrossbarProcess] = []

    def __call__(self, config: dict[str, Any]) -> CrossbarProcess:
        port = _port_of(str(config["listen"])) if "listen" in config else None
        text = yaml.safe_dump(config, sort_keys=False)
        proxy = start_daemon(self.tmp_path_factory.mktemp("crossbar"), text, port=port)
        self.started.append(proxy)
        return proxy

    def stop_all(self) -> None:
        for proxy in self.started:
            proxy.stop()


@pytest.fixture
def crossbar_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CrossbarStarter]:
    """Factory: ``crossbar_process(config: dict) -> CrossbarProcess``.

    Writes ``config`` as YAML to ``<tmp>/crossbar.yaml`` (``listen`` defaults to
    ``tcp:<free port>:interface=127.0.0.1``), runs ``twistd -n --pidfile= crossbar -c
    crossbar.yaml`` there with this checkout first on ``PYTHONPATH``, and returns once the port
    accepts connections. Stopped at teardown.
    """
    starter = CrossbarStarter(tmp_path_factory)
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def module_crossbar_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CrossbarStarter]:
    """``crossbar_process`` for module-scoped fixtures."""
    starter = CrossbarStarter(tmp_path_factory)
    yield starter
    starter.stop_all()


def _port_of(listen: str) -> int:
    """The port of a ``tcp:PORT:...`` endpoint description."""
    parts = listen.split(":")
    if len(parts) < 2 or parts[0] != "tcp" or not parts[1].isdigit():
        raise ValueError(f"cannot tell the port of listen={listen!r}; use tcp:PORT:...")
    return int(parts[1])

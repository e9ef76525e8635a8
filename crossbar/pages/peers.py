"""What a worker knows of the other workers (``workers: N``): where each one's
private loopback port is, so that ``/_crossbar/metrics`` on any of them can gather
every worker's figures, labelled ``worker``, and a reload asked of any of them is
worker 0's; and the run's secret that those ports want, since any local user can
reach a loopback port."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger

from crossbar.config import Secret
from crossbar.stats import merge_workers
from crossbar.upstream import describe

log = Logger()


@attrs.frozen
class WorkerInfo:
    index: int
    count: int
    run_dir: str

    def port_file(self, index: int) -> Path:
        return Path(self.run_dir) / f"worker-{index}.port"


def peer_ports(info: WorkerInfo) -> Mapping[int, int]:
    """The private ports of the other workers that have written theirs."""
    ports = {}
    for index in range(info.count):
        if index == info.index:
            continue
        port = read_port(info.port_file(index))
        if port is not None:
            ports[index] = port
    return ports


SECRET_FILE = "peers.secret"
RELAY_TIMEOUT = 10.0
"""Seconds a worker waits for worker 0's answer to a reload it passed on."""


def peer_secret(info: WorkerInfo) -> Secret:
    """The run's secret, which every worker's private port wants and every worker shows
    its peers. The first to ask (worker 0, before any port opens) makes it: a file of
    mode 0600 in the run directory (itself 0700), written whole before it appears."""
    path = Path(info.run_dir) / SECRET_FILE
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    scratch = path.with_name(f"{SECRET_FILE}.{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with os.fdopen(os.open(scratch, flags, 0o600), "w") as file:
        file.write(secrets.token_urlsafe(32))
    try:
        os.link(scratch, path)  # atomic, and never over one another worker made first
    except FileExistsError:
        pass
    finally:
        scratch.unlink()
    return _read_secret(path)


def _read_secret(path: Path) -> Secret:
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as file:
        return Secret(file.read().strip().encode("ascii"), "the workers' secret")


def peer_headers(info: WorkerInfo) -> dict[bytes, list[bytes]]:
    """What a worker shows another's private port."""
    return {b"Authorization": [b"Bearer " + peer_secret(info).value]}


def publish_port(port: IListeningPort, path: Path) -> None:
    """Publish a worker's private port for its peers (atomically: never half a number)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(str(port.getHost().port))  # type: ignore[attr-defined]
    scratch.replace(path)


def read_port(path: Path) -> int | None:
    """A port :func:`publish_port` wrote; ``None`` while there is none."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


async def gather_metrics(worker: WorkerInfo, own: bytes, client: Any) -> bytes:
    """Every worker's metrics in one exposition: ``own`` and those of the peers that
    answer within 2 s (asked with ``client``, a treq ``HTTPClient``, showing the run's
    secret)."""
    texts = {str(worker.index): own}
    headers = peer_headers(worker)
    for index, port in peer_ports(worker).items():
        url = f"http://127.0.0.1:{port}/_crossbar/metrics?local=1"
        try:
            response = await client.get(url, timeout=2.0, headers=headers)
            if response.code != 200:
                raise ValueError(f"HTTP {response.code}")
            text = await response.content()
            texts[str(index)] = _checked(text)
        except Exception as e:
            log.warn("metrics of worker {index} unavailable: {e}", index=index, e=describe(e))
    return merge_workers(texts)


def _checked(text: bytes) -> bytes:
    """A peer's exposition, refused here (in words, never its bytes) rather than
    breaking the merged page later."""
    try:
        list(text_string_to_metric_families(text.decode("utf-8")))
    except ValueError:
        raise ValueError("answer is not Prometheus text") from None
    return text


async def relay_reload(worker: WorkerInfo, client: Any = treq) -> tuple[int, dict[str, Any]]:
    """Worker 0's answer to a reload asked of another worker, as status and JSON:
    worker 0 reloads every worker, so its answer is the reload's. A worker that only
    passed the request on would say yes to a file that worker 0 then refuses."""
    port = peer_ports(worker).get(0)
    if port is None:
        return 503, _not_confirmed("worker 0 has not published its port yet")
    url = f"http://127.0.0.1:{port}/_crossbar/reload"
    try:
        response = await client.post(url, timeout=RELAY_TIMEOUT, headers=peer_headers(worker))
        body = await response.content()
    except Exception as e:
        why = f"worker 0, which reloads every worker, did not answer: {describe(e)}"
        return 502, _not_confirmed(why)
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return 502, _not_confirmed("worker 0 answered something other than a JSON object")
    return int(response.code), answer


def _not_confirmed(reason: str) -> dict[str, Any]:
    return {"error": "reload not confirmed", "reason": reason}

"""What a worker knows of the other workers (``workers: N``): where each one's
private loopback port is, so that ``/_crossbar/metrics`` on any of them can gather
every worker's figures, labelled ``worker``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger

from crossbar.config import Secret
from crossbar.pages.metrics import merge_workers
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
        try:
            ports[index] = int(info.port_file(index).read_text())
        except (OSError, ValueError):
            continue
    return ports


def publish_port(port: IListeningPort, path: Path) -> None:
    """Publish a worker's private port for its peers (atomically: never half a number)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(str(port.getHost().port))  # type: ignore[attr-defined]
    scratch.replace(path)


async def gather_metrics(
    worker: WorkerInfo, own: bytes, client: Any, key: Secret | None = None
) -> bytes:
    """Every worker's metrics in one exposition: ``own`` and those of the peers that
    answer within 2 s (asked with ``client``, a treq ``HTTPClient``, showing ``key``:
    a peer's private port wants a status key as the pages do, since any local user
    can reach a loopback port)."""
    texts = {str(worker.index): own}
    headers = {} if key is None else {b"Authorization": [b"Bearer " + key.value]}
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

"""The queue's tests' fleet in memory, and a waiting request as the queue sees it."""

from __future__ import annotations

from typing import Any

from crossbar.config import parse_config
from crossbar.queueing import Refused
from crossbar.testing import MemoryProxy

ALICE, BOB = "a" * 24, "b" * 24


def proxy(slots: int | None = 1, keys: list[Any] | None = None, **route: Any) -> MemoryProxy:
    """Two hosts of ``slots`` each (``None``: not known) behind route ``lab``, keyed by
    alice (``max_waiting: 2``) and, unless ``keys`` says otherwise, bob (interactive)."""

    def host(port: int) -> Any:
        url = f"http://127.0.0.1:{port}"
        return url if slots is None else {"url": url, "slots": slots}

    keys = [{"name": "alice", "key": ALICE, "max_waiting": 2}] + (
        keys if keys is not None else [{"name": "bob", "key": BOB, "priority": "interactive"}]
    )
    config = parse_config(
        {
            "hosts": {"gpu-a": host(18081), "gpu-b": host(18082)},
            "api_keys": keys,
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m", **route}},
        }
    )
    return MemoryProxy(config, models=("m",))


class Told:
    """A waiting request, as the queue sees it: what it is told, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[str, object]] = []

    def dispatched(self, waited: float) -> None:
        self.told.append(("dispatched", waited))

    def shed(self, refused: Refused) -> None:
        self.told.append(("shed", refused.reason))

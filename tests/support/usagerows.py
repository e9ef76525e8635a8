"""The rows a usage store keeps, for the ledger's tests."""

from __future__ import annotations

from typing import Any

from crossbar.usage.store import UsageStore


def kept(store: UsageStore, by: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return store.query(0, 10**10, by)

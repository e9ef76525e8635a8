"""What waits in crossbar for a slot, for the metrics and the status pages: requests
waiting per route and per flow, the oldest wait, and each flow's share of the slots over
the last five minutes (:mod:`crossbar.queueing.queue`). Read when asked, never per request."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from crossbar.queueing import Traffic

MIN_SHARE = 0.01
"""Flows below this share of the slots are left out of the metric (labels stay few)."""


def waiting_by_route(traffic: Traffic, now: float) -> dict[str, dict[str, Any]]:
    """Each route with requests waiting: how many, and the oldest wait in seconds."""
    queue, found = traffic.queue, dict[str, dict[str, Any]]()
    for pool, count in queue.pools().items():
        route = pool[0]  # type: ignore[index]
        mine = found.setdefault(route, {"requests": 0, "oldest_seconds": 0.0})
        mine["requests"] += count
        oldest = queue.oldest(pool, now) or 0.0
        mine["oldest_seconds"] = round(max(mine["oldest_seconds"], oldest), 3)
    return found


class QueueCollector:
    """``crossbar_waiting_requests{route}``, ``crossbar_oldest_wait_seconds{route}`` and
    ``crossbar_slot_share{flow}``, from the queue when scraped."""

    def __init__(self, traffic: Traffic, now: Callable[[], float]) -> None:
        self._traffic = traffic
        self._now = now

    def collect(self) -> Iterable[Metric]:
        now = self._now()
        waiting = GaugeMetricFamily(
            "crossbar_waiting_requests",
            "Requests waiting in crossbar for a free slot, by route.",
            labels=["route"],
        )
        oldest = GaugeMetricFamily(
            "crossbar_oldest_wait_seconds",
            "How long the request waiting longest has waited, by route.",
            labels=["route"],
        )
        for route, counts in sorted(waiting_by_route(self._traffic, now).items()):
            waiting.add_metric([route], counts["requests"])
            oldest.add_metric([route], counts["oldest_seconds"])
        share = GaugeMetricFamily(
            "crossbar_slot_share",
            "Each flow's share of the slot-seconds used in the last 5 minutes (a key's name, "
            "or a client's address; flows under 1% left out).",
            labels=["flow"],
        )
        for flow, part in sorted(self._traffic.queue.shares(now).items()):
            if part >= MIN_SHARE:
                share.add_metric([flow], round(part, 4))
        return [waiting, oldest, share]

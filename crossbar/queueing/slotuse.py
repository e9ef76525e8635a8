"""Each flow's use of the slots over the last five minutes: the share the status page and
the metrics show, next to the decayed service the fair queue orders by.

Slot-seconds and requests are summed per bucket of :data:`BUCKET_SECONDS`, so a flow costs
at most a few numbers whatever it sends, and old buckets go as new ones come. How many
flows are kept is the owner's rule (:class:`~crossbar.queueing.queue.FairQueue` forgets idle
ones, at most ``max_flows``): it calls :meth:`SlotTime.forget`. Pure: given the time.
"""

from __future__ import annotations

import attrs

WINDOW_SECONDS = 300
"""How far back :meth:`SlotTime.usage` looks."""
BUCKET_SECONDS = 30
_BUCKETS = WINDOW_SECONDS // BUCKET_SECONDS


@attrs.frozen
class SlotUse:
    """One flow's use of the slots in the window: its part of all slot-seconds used."""

    share: float
    seconds: float
    requests: int


class SlotTime:
    """Slot-seconds and requests that ended, per flow and in all, over the window."""

    def __init__(self) -> None:
        self._flows: dict[str, dict[int, tuple[float, int]]] = {}
        self._all: dict[int, tuple[float, int]] = {}

    def add(self, name: str, seconds: float, now: float) -> None:
        """A request of flow ``name`` ended after holding a slot ``seconds`` (at least 0)."""
        tick = int(now // BUCKET_SECONDS)
        for ticks in (self._flows.setdefault(name, {}), self._all):
            old_seconds, old_requests = ticks.get(tick, (0.0, 0))
            ticks[tick] = (old_seconds + seconds, old_requests + 1)
            if len(ticks) > _BUCKETS:
                for old in [t for t in ticks if t <= tick - _BUCKETS]:
                    del ticks[old]

    def forget(self, name: str) -> None:
        """Flow ``name`` is no longer remembered (what it used still counts in the total)."""
        self._flows.pop(name, None)

    def usage(self, now: float) -> dict[str, SlotUse]:
        """Each flow that used a slot in the last :data:`WINDOW_SECONDS` (to the bucket),
        with its share of the slot-seconds; none when no slot-second was counted."""
        low = int(now // BUCKET_SECONDS) - _BUCKETS
        total = sum(s for t, (s, _) in self._all.items() if t > low)
        if not total:
            return {}
        found = {}
        for name, ticks in self._flows.items():
            seconds = sum(s for t, (s, _) in ticks.items() if t > low)
            requests = sum(n for t, (_, n) in ticks.items() if t > low)
            if seconds:
                found[name] = SlotUse(seconds / total, seconds, requests)
        return found

    def shares(self, now: float) -> dict[str, float]:
        """Each flow's share of the slot-seconds of the window, as :meth:`usage` has it."""
        return {name: used.share for name, used in self.usage(now).items()}

    def __len__(self) -> int:
        """Flows with something counted: at most as many as the owner remembers."""
        return len(self._flows)

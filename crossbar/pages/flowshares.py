"""Each flow's share of the slots over the last five minutes, as the status page and its
JSON show it: who has been served, in words and numbers.

A flow is a key's name (or an unnamed key's fingerprint) or, without keys, a client's
address. The queue remembers at most its ``max_flows`` of them; the page and the JSON show
the :data:`SHOWN` that used the most and sum up the rest in one line, so a flood of flows
makes neither grow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from twisted.web.template import Flattenable, Tag, tags

from crossbar.pages.times import duration, short_seconds
from crossbar.queueing import WINDOW_SECONDS, SlotUse

SHOWN = 20
"""Flows listed one by one; past them, how many more and their share together."""


@attrs.frozen
class FlowShares:
    """The flows that used the slots in the window, the most first, and the rest summed."""

    top: tuple[tuple[str, SlotUse], ...]
    others: int
    others_share: float
    others_requests: int

    @classmethod
    def of(cls, usage: Mapping[str, SlotUse], shown: int = SHOWN) -> FlowShares:
        ranked = sorted(usage.items(), key=lambda item: (-item[1].seconds, item[0]))
        rest = [used for _, used in ranked[shown:]]
        return cls(
            tuple(ranked[:shown]),
            len(rest),
            sum(used.share for used in rest),
            sum(used.requests for used in rest),
        )

    def to_json(self) -> dict[str, Any]:
        """For ``/status``: the listed flows and the rest, shares to 4 places."""
        return {
            "window_seconds": WINDOW_SECONDS,
            "top": [
                {
                    "flow": name,
                    "share": round(used.share, 4),
                    "slot_seconds": round(used.seconds, 3),
                    "requests": used.requests,
                }
                for name, used in self.top
            ],
            "others": {
                "flows": self.others,
                "share": round(self.others_share, 4),
                "requests": self.others_requests,
            },
        }


def flows_section(shares: FlowShares, tag: Tag) -> Flattenable:
    """The page's part: a table, one row a flow, or one line saying none was counted."""
    minutes = WINDOW_SECONDS // 60
    heading = tags.h2("Flows")
    if not shares.top:
        said = f"No request has held a slot in the last {minutes} min (counted where the"
        words = f"{said} hosts' slots are known)."
        return tag(heading, tags.p(words, class_="muted"))
    head = tags.tr(
        tags.th("Flow"),
        tags.th("Share of the slot time", class_="num"),
        tags.th("Slot time", class_="num"),
        tags.th("Requests", class_="num"),
    )
    rows = [_row(name, used) for name, used in shares.top]
    if shares.others:
        more = f"{shares.others} more flows"
        rows.append(_row(more, SlotUse(shares.others_share, 0.0, shares.others_requests)))
    what = (
        f"Each flow (a key's name, or a client's address) and its part of the time the "
        f"hosts' slots spent on requests that ended in the last {minutes} min."
    )
    return tag(
        heading,
        tags.p(what, class_="muted"),
        tags.table(tags.thead(head), tags.tbody(rows), id="flows"),
    )


def _row(name: str, used: SlotUse) -> Tag:
    requests = f"{used.requests} request" + ("" if used.requests == 1 else "s")
    return tags.tr(
        tags.td(tags.b(name), **{"data-label": "Flow"}),
        tags.td(f"{used.share:.0%}", class_="num", **{"data-label": "Share"}),
        tags.td(_slot_time(used.seconds), class_="num", **{"data-label": "Slot time"}),
        tags.td(requests, class_="num", **{"data-label": "Requests"}),
    )


def _slot_time(seconds: float) -> str:
    """``"4.2 s"`` under a minute, ``"12 min"``, ``"3 h 12 min"`` past it; none for the rest."""
    if not seconds:
        return ""
    return short_seconds(seconds) if seconds < 60 else duration(seconds)

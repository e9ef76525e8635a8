"""How often new conversations began with each shared prefix lately, per route and model.

A prefix is what every new conversation of one agent shares: its system prompt and tools
(:attr:`crossbar.routing.Conversation.prefix`). Only a conversation's first turn counts it.
The table is bounded: :data:`MOST` prefixes per route and model, the one seen least
recently forgotten first, and one not seen for :data:`LATELY` seconds is forgotten. Pure
data, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

MOST = 16
"""Prefixes kept per route and model."""
LATELY = 3600.0
"""A prefix not seen for this long is forgotten."""
POPULAR = 2
"""New conversations that began with a prefix lately before it is worth saving."""


@attrs.define
class Seen:
    """One prefix: new conversations that began with it since ``first``, the last at ``last``."""

    prefix: bytes
    count: int
    first: float
    last: float


class PrefixCounts:
    """The prefixes new conversations share, per route and model."""

    def __init__(self, most: int = MOST, lately: float = LATELY) -> None:
        self._most, self._lately = most, lately
        self._seen: dict[tuple[str, str], OrderedDict[bytes, Seen]] = {}

    def saw(self, route: str, model: str, prefix: bytes, now: float) -> int:
        """A new conversation began with ``prefix``: how many did lately, this one included."""
        table = self._table(route, model, now)
        seen = table.pop(prefix, None) or Seen(prefix, 0, now, now)
        seen.count, seen.last = seen.count + 1, now
        table[prefix] = seen
        while len(table) > self._most:
            table.popitem(last=False)
        return seen.count

    def popular(self, route: str, model: str, prefix: bytes, now: float) -> bool:
        """Whether at least :data:`POPULAR` new conversations began with ``prefix`` lately."""
        seen = self._table(route, model, now).get(prefix)
        return seen is not None and seen.count >= POPULAR

    def listing(self, now: float) -> list[dict[str, object]]:
        """Every prefix kept, for the status page: most seen first."""
        rows = []
        for (route, model), table in sorted(self._seen.items()):
            self._forget(table, now)
            for seen in table.values():
                rows.append(
                    {
                        "route": route,
                        "model": model,
                        "prefix": seen.prefix.hex()[:12],
                        "new_conversations": seen.count,
                        "last_seen_ago": round(now - seen.last, 1),
                    }
                )
        rows.sort(key=lambda row: -int(row["new_conversations"]))  # type: ignore[call-overload]
        return rows

    def _table(self, route: str, model: str, now: float) -> OrderedDict[bytes, Seen]:
        table = self._seen.setdefault((route, model), OrderedDict())
        self._forget(table, now)
        return table

    def _forget(self, table: OrderedDict[bytes, Seen], now: float) -> None:
        while table and next(iter(table.values())).last < now - self._lately:
            table.popitem(last=False)

"""The shared slot ledger kept in a Redis store (``shared_state``), for replicas on several
machines: each call is one atomic run of :data:`~crossbar.sharing.script.LEDGER_SCRIPT`.

What comes back from the store is checked as hostile: another process may have written
anything there. A malformed report or offer is left out, never trusted in part.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred

from crossbar.queueing import Head
from crossbar.sharing.ledger import LEASE, Holding, SlotKey, SlotLedger, View
from crossbar.sharing.script import LEDGER_SCRIPT
from crossbar.sharing.wire import is_count, is_name, is_pool, is_time

OFFER_TIME = 2.0
"""Seconds a member has to answer an offer; then the slot goes to the next one waiting."""

PREFIX = "crossbar:"
"""The start of every key and channel crossbar uses in the store."""

_KEYS = ("leases", "reports", "offers", "deadlines", "gifts", "offer-ids")
MOST_MEMBERS = 1024
"""Members read from the store at most (the first ones); a fleet has a few."""
MOST_REPORT = 1 << 20
"""Characters of one member's report at most: a longer one is left out."""


class Commands(Protocol):
    """What the ledger needs of a Redis connection (``txredisapi``'s has it)."""

    def eval(
        self, script: str, keys: Sequence[str] = ..., args: Sequence[Any] = ...
    ) -> Deferred[Any]: ...


@attrs.frozen
class Stored:
    """The ledger as the store holds it now."""

    reports: Mapping[str, Holding] = attrs.field(factory=dict)
    offered: tuple[tuple[str, SlotKey], ...] = ()
    """Each slot offered and not yet answered for, with its member."""
    gifts: Mapping[str, int] = attrs.field(factory=dict)

    def view(self, name: str) -> View:
        """What member ``name`` is shown: the others' holdings, and its gifts counted."""
        ledger = SlotLedger.of(self.reports, self.offered)
        return View(ledger.others(name), self.gifts.get(name, 0))


class StoreLedger:
    """The calls a member makes on the store's ledger, each answered by a Deferred."""

    def __init__(
        self,
        commands: Commands,
        prefix: str = PREFIX,
        lease: float = LEASE,
        offer_time: float = OFFER_TIME,
    ) -> None:
        self.commands, self.prefix = commands, prefix
        self.lease_ms, self.offer_ms = round(lease * 1000), round(offer_time * 1000)
        self.keys = [prefix + key for key in _KEYS]

    def _run(self, op: str, *args: object) -> Deferred[Any]:
        return self.commands.eval(LEDGER_SCRIPT, self.keys, [op, self.prefix, self.offer_ms, *args])

    def report(self, name: str, holding: Holding) -> Deferred[Any]:
        """Member ``name`` holds this now (and is alive for a lease)."""
        return self._run("report", name, self.lease_ms, dump_stored(holding))

    def beat(self, name: str) -> Deferred[bool]:
        """Member ``name`` is alive: ``False`` when the store no longer knows it (its lease
        ran out, or the store was emptied), so that it reports again."""
        return self._run("beat", name, self.lease_ms).addCallback(lambda known: known == 1)

    def give(
        self, name: str, slot: SlotKey, pools: Sequence[Hashable], gift: int
    ) -> Deferred[str | None]:
        """Member ``name`` gives a slot it freed (its gift number ``gift``): the member it
        is offered to, or ``None`` when nobody waits for it any more."""
        encoded = json.dumps([pool_text(p) for p in pools])
        ran = self._run("give", name, slot_text(slot), encoded, gift)
        return ran.addCallback(lambda to: to if isinstance(to, str) and to else None)

    def answer(self, name: str, offer: str, took: bool) -> Deferred[Any]:
        """Member ``name`` took offer ``offer``'s slot, or passes it to the next one."""
        return self._run("answer", name, offer, "1" if took else "0")

    def leave(self, name: str) -> Deferred[Any]:
        """Member ``name`` stops: what it held is free at once."""
        return self._run("leave", name)

    def read(self) -> Deferred[Stored]:
        """The ledger now (members past their lease dropped first)."""
        return self._run("read").addCallback(load_state)


def changes_channel(prefix: str = PREFIX) -> str:
    """The channel every change is published on (its message: who changed it)."""
    return prefix + "changed"


def offers_channel(name: str, prefix: str = PREFIX) -> str:
    """The channel offers to member ``name`` are published on."""
    return f"{prefix}offer:{name}"


def slot_text(slot: SlotKey) -> str:
    """A slot as the store's reports key it: compact JSON of host and model."""
    return json.dumps(list(slot), separators=(",", ":"))


def pool_text(pool: Hashable) -> str:
    """A pool (a tuple of names) as the store's reports key it: compact JSON."""
    return json.dumps(list(pool), separators=(",", ":"))  # type: ignore[call-overload]


def dump_stored(holding: Holding) -> str:
    """A holding as the store keeps a report."""
    return json.dumps(
        {
            "counts": {slot_text(slot): n for slot, n in holding.counts.items() if n > 0},
            "heads": {pool_text(pool): list(head) for pool, head in holding.heads.items()},
            "flows": {flow: n for flow, n in holding.flows.items() if n > 0},
        },
        separators=(",", ":"),
    )


def load_stored(text: object) -> Holding | None:
    """A report as :func:`dump_stored` wrote it; ``None`` when it is not one."""
    value = _json(text)
    if not isinstance(value, dict):
        return None
    counts: dict[SlotKey, int] = {}
    heads: dict[Hashable, Head] = {}
    flows: dict[str, int] = {}
    for key, n in _items(value.get("counts")):
        slot = load_slot(key)
        if slot is not None and is_count(n) and n > 0:
            counts[slot] = n
    for key, head in _items(value.get("heads")):
        pool = _json(key)
        if is_pool(pool) and isinstance(head, list) and len(head) == 4:
            band, in_flight, arrived, flow = head
            if is_count(band) and is_count(in_flight) and is_time(arrived) and is_name(flow):
                heads[tuple(pool)] = (band, in_flight, float(arrived), flow)
    for flow, n in _items(value.get("flows")):
        if is_name(flow) and is_count(n) and n > 0:
            flows[flow] = n
    return Holding(counts, heads, flows)


def load_slot(text: object) -> SlotKey | None:
    value = _json(text)
    if not (isinstance(value, list) and len(value) == 2 and is_name(value[0])):
        return None
    return (value[0], value[1]) if value[1] is None or is_name(value[1]) else None


def load_state(answer: object) -> Stored:
    """The script's answer to ``read``: reports, offers and gifts, each checked."""
    if not (isinstance(answer, list) and len(answer) == 3):
        return Stored()
    reports: dict[str, Holding] = {}
    for name, text in _pairs(answer[0]):
        holding = load_stored(text)
        if holding is not None:
            reports[name] = holding
    offered = []
    for name, text in _pairs(answer[1]):
        slot = load_slot(text)
        if slot is not None:
            offered.append((name, slot))
    gifts = {
        name: int(str(n)) for name, n in _pairs(answer[2]) if str(n).isdigit() and len(str(n)) < 12
    }
    return Stored(reports, tuple(offered), gifts)


def _pairs(flat: object) -> list[tuple[str, object]]:
    """A Redis flat list ``[k1, v1, k2, v2, ...]`` as pairs, names checked, at most
    :data:`MOST_MEMBERS` of them."""
    if not isinstance(flat, list):
        return []
    pairs = zip(flat[: 2 * MOST_MEMBERS : 2], flat[1 : 2 * MOST_MEMBERS : 2], strict=False)
    return [(k, v) for k, v in pairs if is_name(k)]


def _items(value: object) -> list[tuple[str, Any]]:
    return list(value.items()) if isinstance(value, dict) else []


def _json(text: object) -> Any:
    if not isinstance(text, str | bytes) or len(text) > MOST_REPORT:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None

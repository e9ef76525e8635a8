"""The workers' slot-count messages, as Twisted AMP commands over a loopback connection to
worker 0 (``workers: N``), and their JSON arguments.

A worker joins with the run's secret (any local user can reach a loopback port), then
reports its counts and waiting heads whenever they change (at most once a reactor turn)
and gives freed slots that are owed elsewhere; worker 0 sends each worker the others'
counts and heads, and offers it slots. Only :class:`Beat` and :class:`Offer` are answered:
the rest are as cheap as a write.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.protocols import amp

from crossbar.queueing import Head
from crossbar.routing import Placed, read_placed
from crossbar.sharing.ledger import Holding, SlotKey


class CountConnection(amp.AMP):
    """AMP without its log line at every connect and close: the workers' own lines say
    what matters (a worker lost, or back)."""

    def makeConnection(self, transport: Any) -> None:
        amp.BinaryBoxProtocol.makeConnection(self, transport)

    def connectionLost(self, reason: Any) -> None:  # type: ignore[override]
        amp.BinaryBoxProtocol.connectionLost(self, reason)
        self.transport = None


class Join(amp.Command):
    """A worker says who it is, with the run's secret; a wrong secret closes the connection."""

    arguments = [(b"name", amp.Unicode()), (b"secret", amp.Unicode())]
    response = []  # type: ignore[var-annotated]
    errors = {PermissionError: b"REFUSED"}


class Report(amp.Command):
    """A worker's requests in flight per host and model and per flow, and its waiting
    heads, now."""

    arguments = [(b"counts", amp.Unicode()), (b"heads", amp.Unicode()), (b"flows", amp.Unicode())]
    requiresAnswer = False


class Give(amp.Command):
    """A worker freed a slot that is owed to a request waiting in another worker."""

    arguments = [(b"slot", amp.Unicode()), (b"pools", amp.Unicode()), (b"gift", amp.Integer())]
    requiresAnswer = False


class Beat(amp.Command):
    """A worker's heartbeat: answered, so that each side knows the other is alive."""

    arguments = []  # type: ignore[var-annotated]
    response = []  # type: ignore[var-annotated]


class Others(amp.Command):
    """Worker 0 tells a worker what every other worker holds and has waiting, counting
    the worker's gifts up to ``gifts`` (their number) as held elsewhere."""

    arguments = [
        (b"counts", amp.Unicode()),
        (b"heads", amp.Unicode()),
        (b"flows", amp.Unicode()),
        (b"gifts", amp.Integer()),
    ]
    requiresAnswer = False


class Offer(amp.Command):
    """Worker 0 offers a worker a freed slot: it answers whether a request of its took it."""

    arguments = [(b"slot", amp.Unicode())]
    response = [(b"took", amp.Boolean())]


class Place(amp.Command):
    """``cache_affinity`` placed these conversations' turns: a worker tells worker 0, which
    tells every other worker (and, as it joins, a worker that was not there). Its answer
    says that they were told: a turn placed anew waits for it (:mod:`placesync`)."""

    arguments = [(b"placed", amp.Unicode())]


MOST_PLACED = 500
"""Placements in one :class:`Place` at most (an AMP value holds 64 KiB)."""


def send_placed(connection: amp.AMP, placed: Sequence[Placed]) -> Deferred[object]:
    """Placements sent as :class:`Place` commands of :data:`MOST_PLACED` each: what fires
    once every one is answered (or failed: the connection's loss says so)."""
    sent = [
        connection.callRemote(Place, placed=dump_placed(placed[start : start + MOST_PLACED]))
        for start in range(0, len(placed), MOST_PLACED)
    ]
    return DeferredList(sent, consumeErrors=True)  # type: ignore[return-value]


def dump_placed(placed: Sequence[Placed]) -> str:
    """Placements as :class:`Place`'s argument: key in hex, host, turn, age in seconds."""
    return json.dumps([[p.key.hex(), p.host, p.turn, round(p.age, 3)] for p in placed])


def load_placed(text: str) -> list[Placed]:
    """Placements as :func:`dump_placed` wrote them; malformed ones left out."""
    items = [item for item in _list(text)[:MOST_PLACED] if isinstance(item, list)]
    placed = [read_placed(*item) for item in items if len(item) == 4]
    return [one for one in placed if one is not None]


def dump_report(report: Holding) -> dict[str, str]:
    """A holding as the arguments of :class:`Report` (and, with ``gifts``, :class:`Others`)."""
    counts, heads = dump_counts(report.counts), dump_heads(report.heads)
    return {"counts": counts, "heads": heads, "flows": dump_flows(report.flows)}


def load_report(counts: str, heads: str, flows: str) -> Holding:
    """A holding from :func:`dump_report`'s arguments; whatever is malformed left out."""
    return Holding(load_counts(counts), load_heads(heads), load_flows(flows))


def dump_counts(counts: Mapping[SlotKey, int]) -> str:
    return json.dumps([[host, model, n] for (host, model), n in counts.items() if n > 0])


def load_counts(text: str) -> dict[SlotKey, int]:
    """Counts as :func:`dump_counts` wrote them; anything malformed is left out."""
    found: dict[SlotKey, int] = {}
    for item in _list(text):
        if isinstance(item, list) and len(item) == 3:
            host, model, n = item
            if is_name(host) and (model is None or is_name(model)) and is_count(n):
                found[host, model] = n
    return found


def dump_heads(heads: Mapping[Hashable, Head]) -> str:
    """Heads (:data:`~crossbar.queueing.Head`), by pool."""
    return json.dumps([[list(pool), list(head)] for pool, head in heads.items()])  # type: ignore[call-overload]


def load_heads(text: str) -> dict[Hashable, Head]:
    """Heads as :func:`dump_heads` wrote them: pools as tuples again; malformed ones left out."""
    found: dict[Hashable, Head] = {}
    for pool, head in _heads(text, 4):
        if is_name(head[3]):
            found[pool] = (head[0], head[1], float(head[2]), head[3])
    return found


def _heads(text: str, size: int) -> list[tuple[Hashable, list[Any]]]:
    found: list[tuple[Hashable, list[Any]]] = []
    for item in _list(text):
        if not (isinstance(item, list) and len(item) == 2):
            continue
        pool, head = item
        if not (is_pool(pool) and isinstance(head, list) and len(head) == size):
            continue
        if is_count(head[0]) and is_count(head[1]) and is_time(head[2]):
            found.append((tuple(pool), head))
    return found


def dump_flows(flows: Mapping[str, int]) -> str:
    return json.dumps([[flow, n] for flow, n in flows.items() if n > 0])


def load_flows(text: str) -> dict[str, int]:
    """Each flow's requests in flight; malformed entries left out."""
    found: dict[str, int] = {}
    for item in _list(text):
        if isinstance(item, list) and len(item) == 2 and is_name(item[0]) and is_count(item[1]):
            found[item[0]] = item[1]
    return found


def dump_slot(host: str, model: str | None) -> str:
    return json.dumps([host, model])


def load_slot(text: str) -> SlotKey | None:
    item = _list(text)
    if len(item) == 2 and is_name(item[0]) and (item[1] is None or is_name(item[1])):
        return item[0], item[1]
    return None


def dump_pools(pools: list[Hashable]) -> str:
    return json.dumps([list(pool) for pool in pools])  # type: ignore[call-overload]


def load_pools(text: str) -> list[Hashable]:
    return [tuple(p) for p in _list(text) if is_pool(p)]


def _list(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return []
    return value if isinstance(value, list) else []


def is_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 1024


def is_pool(value: object) -> bool:
    """A pool: a route, a model (or none), and perhaps a host; names only."""
    return (
        isinstance(value, list)
        and 2 <= len(value) <= 3
        and all(p is None or is_name(p) for p in value)
    )


def is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31

"""Model lists: what a host's ``GET /v1/models`` answer says it has, and the one list a
route with ``list_models: merged`` answers for all its healthy hosts. Pure, no I/O.

Every host's list is read every few seconds, on the reactor thread, and a router may
know thousands of models: msgspec reads only the fields used (``data[].id`` and
``data[].status.value``) into structs and skips every other field in C, without
building it (100,000 entries, 10 to 14 MiB: about 30 ms, where reading them with
``json.loads`` took 160 to 280 ms).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from crossbar.config import RouteConfig
from crossbar.fleet.state import HostState

_Value = str | int | float | bool | list[Raw] | dict[str, Raw] | None
"""Any JSON value; an array's or object's contents are left unread (a hostile host's
huge or deep value costs nothing to skip)."""


# gc=False: decoded from JSON, these can never be part of a reference cycle, and
# tracking a hundred thousand of them would cost more than reading them.
class _Status(msgspec.Struct, gc=False):
    value: _Value | UnsetType = UNSET


class _Entry(msgspec.Struct, gc=False):
    id: _Value | UnsetType = UNSET
    status: _Status | str | int | float | bool | list[Raw] | UnsetType | None = UNSET


class _Listing(msgspec.Struct, gc=False):
    data: list[_Entry]


_LISTING = msgspec.json.Decoder(_Listing)
_OUTLINE = msgspec.json.Decoder(dict[str, Raw])
_ITEMS = msgspec.json.Decoder(list[Raw])
_NOT_A_LIST = 'expected {"data": [...]}'


def parse_models(body: bytes) -> tuple[list[str], list[str]]:
    """``(loaded, known)`` model ids from a ``/v1/models`` answer; ``ValueError`` (its
    text in words) when the answer is not such a list.

    In router mode every model the router knows is listed with ``status.value``;
    only ``loaded`` is resident. An entry without ``status`` (single-model
    llama-server) is resident. An entry whose id is not a non-empty string is skipped.
    """
    try:
        listing = _LISTING.decode(body)
    except msgspec.ValidationError as e:
        raise ValueError(_misshapen(body, e)) from None
    except msgspec.DecodeError as e:
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    loaded: list[str] = []
    known: list[str] = []
    for entry in listing.data:
        model_id = entry.id
        if type(model_id) is not str or not model_id:
            continue
        known.append(model_id)
        status = entry.status
        plain = status is None or status is UNSET  # a single-model llama-server's entry
        if plain or (isinstance(status, _Status) and status.value == "loaded"):
            loaded.append(model_id)
    return loaded, known


def _misshapen(body: bytes, error: msgspec.ValidationError) -> str:
    """Which part of a well-formed answer is not a model list, found only when one is
    not: the same words whatever the shape."""
    try:
        data = _OUTLINE.decode(body).get("data")
        items = _ITEMS.decode(data) if data is not None else None
    except (msgspec.DecodeError, RecursionError):
        return _NOT_A_LIST
    if items is None:
        return _NOT_A_LIST
    for item in items:
        if memoryview(item)[:1].tobytes() != b"{":
            return "a data entry is not an object"
    return str(error)  # an entry's id or status msgspec cannot read, e.g. 1e999


def merged_listing(
    route: RouteConfig, states: Mapping[str, HostState], now: int
) -> dict[str, Any] | None:
    """Every model the route's healthy hosts know, once each, in the OpenAI list shape;
    ``None`` when no host of the route is healthy.

    ``status.value`` is ``loaded`` when any of them has the model resident, else
    ``unloaded`` (llama-server's words); ``owned_by`` names the hosts that have it loaded,
    or, when none has, the hosts that know it.
    """
    healthy = [states[h] for h in route.hosts if h in states and states[h].healthy]
    if not healthy:
        return None
    loaded: dict[str, list[str]] = {}
    known: dict[str, list[str]] = {}
    for state in healthy:
        for model in state.known:
            known.setdefault(model, []).append(state.name)
        for model in state.loaded:
            loaded.setdefault(model, []).append(state.name)
            known.setdefault(model, [])
    data = [
        {
            "id": model,
            "object": "model",
            "created": now,
            "owned_by": ", ".join(loaded.get(model) or known[model]),
            "status": {"value": "loaded" if model in loaded else "unloaded"},
        }
        for model in sorted(known)
    ]
    return {"object": "list", "data": data}

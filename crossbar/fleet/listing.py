"""Model lists: what a host's ``GET /v1/models`` says it has, and the one list a route
with ``list_models: merged`` answers for all its healthy hosts. Pure, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from crossbar.config import RouteConfig
from crossbar.fleet.state import HostState


def parse_models(body: bytes) -> tuple[list[str], list[str]]:
    """``(loaded, known)`` model ids from a ``/v1/models`` answer.

    In router mode every model the router knows is listed with ``status.value``;
    only ``loaded`` is resident. An entry without ``status`` (single-model
    llama-server) is resident.
    """
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError('expected {"data": [...]}')
    loaded: list[str] = []
    known: list[str] = []
    for entry in doc["data"]:
        if not isinstance(entry, dict):
            raise ValueError("a data entry is not an object")
        model_id = entry.get("id")
        if not isinstance(model_id, str) or not model_id:
            continue
        known.append(model_id)
        status = entry.get("status")
        if status is None or (isinstance(status, dict) and status.get("value") == "loaded"):
            loaded.append(model_id)
    return loaded, known


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

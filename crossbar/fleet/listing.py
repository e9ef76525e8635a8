"""What a host's ``GET /v1/models`` says it has: pure parsing, no I/O."""

from __future__ import annotations

import json


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

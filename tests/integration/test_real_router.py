"""Smoke test of the integration fixtures against a real llama-server router (no crossbar)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.integration
def test_router_lists_models_unloaded(
    tiny_models: Callable[..., Path], llama_router: Callable[..., Any]
) -> None:
    router = llama_router(tiny_models("tiny-a", "tiny-b"))

    with urllib.request.urlopen(f"{router.url}/v1/models", timeout=10) as response:
        assert response.status == 200
        body = json.load(response)

    assert body["object"] == "list"
    statuses = {entry["id"]: entry["status"]["value"] for entry in body["data"]}
    assert statuses == {"tiny-a": "unloaded", "tiny-b": "unloaded"}, router.log()

"""crossbar learns a real router's slots per loaded model (``total_slots``, its ``-np``) through
``GET /props?model=X&autoload=false``, and the router loads and unloads nothing for it: every
model's ``status.value`` in the router's own ``/v1/models`` is the same before and after many
polls. No ``slots:`` in the config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import CrossbarStarter, RouterStarter
from tests.support.fleet import (
    SEEN_TIMEOUT,
    one_host_crossbar,
    request,
    statuses_of,
    wait_until,
)

pytestmark = pytest.mark.integration

POLLS_WATCHED = 12
"""Good polls, each with its asks, watched after the slots are learned (about 3 s)."""


def test_slots_of_the_loaded_model_are_learned_and_no_model_is_loaded_or_unloaded(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
) -> None:
    router = llama_router(tiny_models("tiny-a", "tiny-b", "tiny-c"), extra_args=("-np", "3"))
    assert request("POST", f"{router.url}/models/load", {"model": "tiny-a"}).status == 200
    wait_until(lambda: statuses_of(router)["tiny-a"] == "loaded", SEEN_TIMEOUT, "tiny-a loaded")
    before = statuses_of(router)
    assert before == {"tiny-a": "loaded", "tiny-b": "unloaded", "tiny-c": "unloaded"}

    # What crossbar relies on, asked of the router itself: a model not loaded is refused.
    refused = request("GET", f"{router.url}/props?model=tiny-b&autoload=false", timeout=10)
    assert refused.status == 400 and b"model is not loaded" in refused.body, refused

    _, host = one_host_crossbar(crossbar_process, router, "tiny-a")

    learned = wait_until(
        lambda: host().get("slots"), SEEN_TIMEOUT, "crossbar learns tiny-a's slots"
    )
    assert learned == {"tiny-a": 3}, host()
    start = host()["consecutive"]
    wait_until(
        lambda: host()["consecutive"] >= start + POLLS_WATCHED,
        SEEN_TIMEOUT,
        f"{POLLS_WATCHED} more good polls",
    )
    assert statuses_of(router) == before, router.log()
    assert host()["slots"] == {"tiny-a": 3} and host()["healthy"]

    # Unloaded: forgotten, and nothing is loaded in its place.
    assert request("POST", f"{router.url}/models/unload", {"model": "tiny-a"}).status == 200
    wait_until(lambda: "slots" not in host(), SEEN_TIMEOUT, "crossbar forgets tiny-a's slots")
    start = host()["consecutive"]
    wait_until(lambda: host()["consecutive"] >= start + 4, SEEN_TIMEOUT, "4 more good polls")
    assert set(statuses_of(router).values()) == {"unloaded"}, router.log()

"""crossbar reads a real router's room (``max_instances``, its ``--models-max``) from the
router's own ``GET /props`` asked *without* ``?model=``, and that ask loads nothing: every
model's ``status.value`` in the router's ``/v1/models`` is the same before and after, with a
model loaded and with none."""

from __future__ import annotations

import json
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


def test_props_without_a_model_tell_the_room_and_load_nothing(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
) -> None:
    router = llama_router(tiny_models("tiny-a", "tiny-b", "tiny-c"), models_max=2)
    before = statuses_of(router)
    assert set(before.values()) == {"unloaded"}
    for _ in range(5):  # asked of the router itself, nothing loaded
        answer = request("GET", f"{router.url}/props", timeout=10)
        props = json.loads(answer.body)
        assert answer.status == 200 and props["role"] == "router", answer
        assert (props["max_instances"], props["models_autoload"]) == (2, True)
    assert statuses_of(router) == before, router.log()

    assert request("POST", f"{router.url}/models/load", {"model": "tiny-b"}).status == 200
    wait_until(lambda: statuses_of(router)["tiny-b"] == "loaded", SEEN_TIMEOUT, "tiny-b loaded")
    before = statuses_of(router)
    _, host = one_host_crossbar(crossbar_process, router, "tiny-b")

    learned = wait_until(
        lambda: host().get("max_instances"), SEEN_TIMEOUT, "crossbar learns the router's room"
    )
    assert learned == 2, host()
    start = host()["consecutive"]
    wait_until(lambda: host()["consecutive"] >= start + 8, SEEN_TIMEOUT, "8 more good polls")
    assert statuses_of(router) == before, router.log()
    assert before == {"tiny-a": "unloaded", "tiny-b": "loaded", "tiny-c": "unloaded"}

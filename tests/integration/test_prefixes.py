"""Shared prompt prefixes on a real llama-server router: crossbar saves a slot holding an
agent's system prompt once two new conversations began with it (``POST /slots/N?action=save``,
the model in the body, as this build's router reads it), and restores it before the next
new conversation, which prefills only its own tokens; a router started without
``--slot-save-path`` answers 501 and is left alone; a model reloaded between a save and a
restore is saved again, never restored from the file of its earlier start. A save of a busy
slot waits for its turn to end, and writes all of that turn."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import CrossbarProcess, CrossbarStarter, RouterStarter
from tests.support.fleet import SEEN_TIMEOUT, crossbar_status, request, statuses_of, wait_until

pytestmark = pytest.mark.integration

MODEL = "tiny-a"
SYSTEM = "You are a careful coding agent. " + "Read the files, then answer. " * 60


def new_conversation(proxy: CrossbarProcess, first: str) -> dict[str, Any]:
    """A new conversation's first turn: its ``timings``."""
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}],
        "max_tokens": 4,
        "temperature": 0.8,
        "seed": 7,
    }
    answer = request("POST", f"{proxy.url}/lab/v1/chat/completions", body)
    assert answer.status == 200, f"{answer.status}: {answer.body[:300]!r}"
    timings: dict[str, Any] = answer.json()["timings"]
    return timings


def host_prefixes(proxy: CrossbarProcess) -> dict[str, Any]:
    hosts: list[dict[str, Any]] = crossbar_status(proxy)["prefixes"]["hosts"]
    return hosts[0] if hosts else {}


def crossbar_on(
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    models: Path,
    saves: Path | None,
) -> tuple[Any, CrossbarProcess]:
    """A router (``saves``: its ``--slot-save-path``, made here) with the model loaded, and
    crossbar in front of it, seeing it loaded."""
    extra: tuple[str, ...] = ()
    if saves is not None:
        saves.mkdir()
        extra = ("--slot-save-path", str(saves))
    router = llama_router(models, extra_args=("-np", "2", "-c", "8192", *extra))
    loaded = request("POST", f"{router.url}/models/load", {"model": MODEL})
    assert loaded.status == 200, loaded
    wait_until(lambda: statuses_of(router)[MODEL] == "loaded", SEEN_TIMEOUT, f"{MODEL} loaded")
    route = {"hosts": ["gpu-a"], "default_model": MODEL, "policy": "cache_affinity"}
    proxy = crossbar_process(
        {"poll_interval": "250ms", "hosts": {"gpu-a": router.url}, "routes": {"lab": route}}
    )
    wait_until(
        lambda: MODEL in crossbar_status(proxy)["hosts"]["gpu-a"]["loaded"],
        SEEN_TIMEOUT,
        f"crossbar sees {MODEL} loaded",
    )
    return router, proxy


def saved_after_two(proxy: CrossbarProcess) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Two new conversations; once crossbar saved their prefix: the first's ``timings``, and
    what the host holds saved."""
    first = new_conversation(proxy, "fix the tests")
    new_conversation(proxy, "write the docs")
    held = wait_until(lambda: host_prefixes(proxy).get("saved"), SEEN_TIMEOUT, "a prefix saved")
    return first, held


def test_a_saved_prefix_is_restored_before_a_new_conversation(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    tmp_path: Path,
) -> None:
    saves = tmp_path / "slots"
    _, proxy = crossbar_on(llama_router, crossbar_process, tiny_models(MODEL), saves)
    first, held = saved_after_two(proxy)
    assert held[0]["tokens"] >= first["prompt_n"]
    assert [p.name for p in saves.iterdir()] == ["crossbar-prefix-0.bin"]
    third = new_conversation(proxy, "add a flag")
    assert host_prefixes(proxy)["restores"] == 1
    assert third["cache_n"] > 0.9 * first["prompt_n"]  # the shared prefix, not prefilled again


def test_a_router_without_a_save_path_is_asked_once(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
) -> None:
    _, proxy = crossbar_on(llama_router, crossbar_process, tiny_models(MODEL), None)
    new_conversation(proxy, "fix the tests")
    new_conversation(proxy, "write the docs")
    wait_until(
        lambda: host_prefixes(proxy).get("allows_saves") is False,
        SEEN_TIMEOUT,
        "crossbar learns the router keeps no saved slots",
    )
    new_conversation(proxy, "add a flag")
    assert host_prefixes(proxy)["restores"] == 0


def test_a_model_reloaded_between_save_and_restore_is_saved_again(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    tmp_path: Path,
) -> None:
    router, proxy = crossbar_on(
        llama_router, crossbar_process, tiny_models(MODEL), tmp_path / "slots"
    )
    saved_after_two(proxy)
    for action in ("unload", "load"):
        assert request("POST", f"{router.url}/models/{action}", {"model": MODEL}).status == 200
        want = "loaded" if action == "load" else "unloaded"
        wait_until(lambda w=want: statuses_of(router)[MODEL] == w, SEEN_TIMEOUT, f"{MODEL} {want}")
    new_conversation(proxy, "add a flag")
    saved = wait_until(
        lambda: len(host_prefixes(proxy)["saved"]) == 2 and host_prefixes(proxy)["saved"],
        SEEN_TIMEOUT,
        "the prefix saved again for the model's new start",
    )
    assert host_prefixes(proxy)["restores"] == 0
    assert {s["model"] for s in saved} == {MODEL}


def test_the_router_saves_a_busy_slot_once_its_turn_ended(
    tiny_models: Callable[..., Path],
    llama_router: RouterStarter,
    crossbar_process: CrossbarStarter,
    tmp_path: Path,
) -> None:
    router, _ = crossbar_on(llama_router, crossbar_process, tiny_models(MODEL), tmp_path / "s")
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}],
        "max_tokens": 1500,  # long enough to be asked for a save while it runs
        "ignore_eos": True,
    }
    turn: list[Any] = []
    running = threading.Thread(
        target=lambda: turn.append(request("POST", f"{router.url}/v1/chat/completions", body))
    )
    running.start()
    busy = wait_until(
        lambda: [s["id"] for s in slots_of(router) if s["is_processing"]] or None,
        SEEN_TIMEOUT,
        "the turn running in a slot",
    )
    saved = request(
        "POST", f"{router.url}/slots/{busy[0]}?action=save", {"filename": "b.bin", "model": MODEL}
    )
    running.join()
    assert saved.status == 200 and turn[0].status == 200
    timings = turn[0].json()["timings"]
    whole = timings["cache_n"] + timings["prompt_n"] + timings["predicted_n"]
    assert saved.json()["n_saved"] >= whole - 1  # the whole turn, answer included


def slots_of(router: Any) -> list[dict[str, Any]]:
    answer = request("GET", f"{router.url}/slots?model={MODEL}")
    assert answer.status == 200
    listed: list[dict[str, Any]] = answer.json()
    return listed

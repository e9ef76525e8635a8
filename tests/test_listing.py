"""crossbar.fleet.listing: the models a host's ``GET /v1/models`` answer says it has loaded
and knows. Pure parsing, called directly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.config import RouteConfig
from crossbar.fleet import HostState
from crossbar.fleet.listing import merged_listing, parse_models
from tests.support import ROUTER_LISTING


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_router_listing_loads_only_the_loaded_ones_and_knows_them_all() -> None:
    assert parse_models(body(ROUTER_LISTING)) == (
        ["tiny-b", "tiny-a"],
        ["tiny-b", "tiny-a", "tiny-c", "tiny-d"],
    )


def test_single_model_server_entry_without_status_is_resident() -> None:
    listing = {"object": "list", "data": [{"id": "models/tiny-a.gguf", "object": "model"}]}
    assert parse_models(body(listing)) == (["models/tiny-a.gguf"], ["models/tiny-a.gguf"])


@pytest.mark.parametrize(
    "status",
    ["loaded", {"value": "Loaded"}, {"args": []}, {"value": None}, []],
)
def test_a_status_that_does_not_say_loaded_is_not_resident(status: object) -> None:
    listing = {"data": [{"id": "m", "status": status}]}
    assert parse_models(body(listing)) == ([], ["m"])


def test_an_empty_list_is_a_good_answer() -> None:
    assert parse_models(b'{"object": "list", "data": []}') == ([], [])


def test_entries_without_a_usable_id_are_skipped() -> None:
    listing = {
        "data": [
            {"object": "model", "status": {"value": "loaded"}},
            {"id": "", "status": {"value": "loaded"}},
            {"id": None},
            {"id": 7},
            {"id": "kept", "status": {"value": "loaded"}},
        ]
    }
    assert parse_models(body(listing)) == (["kept"], ["kept"])


def test_repeated_ids_are_listed_as_given() -> None:
    """Sorting and removing repeats is the health table's job."""
    listing = {"data": [{"id": "b"}, {"id": "a"}, {"id": "b", "status": {"value": "unloaded"}}]}
    assert parse_models(body(listing)) == (["b", "a"], ["b", "a", "b"])


@pytest.mark.parametrize("entry", [1, "tiny-a", None, ["tiny-a"]])
def test_an_entry_that_is_not_an_object_is_a_bad_answer(entry: object) -> None:
    with pytest.raises(ValueError, match=r"^a data entry is not an object$"):
        parse_models(body({"data": [{"id": "ok"}, entry]}))


@pytest.mark.parametrize(
    "doc",
    [
        {"models": []},
        {"data": {"id": "m"}},
        {"data": "m"},
        {"data": None},
        [{"id": "m"}],
        "data",
    ],
)
def test_data_that_is_not_a_list_is_a_bad_answer(doc: object) -> None:
    with pytest.raises(ValueError, match=r'^expected \{"data": \[\.\.\.\]\}$'):
        parse_models(body(doc))


@pytest.mark.parametrize("text", [b"", b"not json", b'{"data": [', b"\xff\xfe{}"])
def test_an_answer_that_is_not_json_is_a_bad_answer(text: bytes) -> None:
    with pytest.raises(ValueError):
        parse_models(text)


# -- merged_listing: the one list of a route with list_models: merged ---------------------------


def _state(
    name: str, loaded: tuple[str, ...], known: tuple[str, ...], healthy: bool = True
) -> HostState:
    return HostState(name=name, url=f"http://{name}", healthy=healthy, loaded=loaded, known=known)


ROUTE = RouteConfig("lab", ("gpu-a", "gpu-b", "gpu-c"), None, list_models="merged")


def test_merged_listing_has_every_model_of_the_healthy_hosts_once() -> None:
    states = {
        "gpu-a": _state("gpu-a", ("m1",), ("m1", "m2")),
        "gpu-b": _state("gpu-b", ("m2", "m1"), ("m1", "m2", "m3")),
        "gpu-c": _state("gpu-c", ("m9",), ("m9",), healthy=False),  # down: not listed
        "gpu-x": _state("gpu-x", ("mx",), ("mx",)),  # not on the route
    }
    listing = merged_listing(ROUTE, states, now=1_700_000_000)
    assert listing == {
        "object": "list",
        "data": [
            {
                "id": "m1",
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "gpu-a, gpu-b",
                "status": {"value": "loaded"},
            },
            {
                "id": "m2",
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "gpu-b",
                "status": {"value": "loaded"},
            },
            {
                "id": "m3",
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "gpu-b",
                "status": {"value": "unloaded"},
            },
        ],
    }


def test_merged_listing_with_no_healthy_host_is_none() -> None:
    states = {"gpu-a": _state("gpu-a", ("m1",), ("m1",), healthy=False)}
    assert merged_listing(ROUTE, states, now=0) is None


def test_merged_listing_of_healthy_hosts_that_know_nothing_is_empty() -> None:
    states = {"gpu-a": _state("gpu-a", (), ())}
    assert merged_listing(ROUTE, states, now=0) == {"object": "list", "data": []}

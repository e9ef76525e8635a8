"""crossbar.polling.modellist: the models a host's ``GET /v1/models`` answer says it has loaded
and knows. Pure parsing, called directly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossbar.config import RouteConfig
from crossbar.polling.health import HostState
from crossbar.polling.modellist import (
    MAX_ID_BYTES,
    MAX_MERGED,
    MAX_MODELS,
    merged_listing,
    parse_models,
    read_models,
)
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


def test_a_real_router_entry_is_read_past_every_field_crossbar_does_not_use() -> None:
    entry = {
        "id": "tiny-a",
        "aliases": ["a", {"x": [1, 2.5, None]}],
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": 1796059518,
        "status": {
            "value": "loaded",
            "args": ["llama-server", "--port", "0"],
            "preset": "[tiny-a]\n",
            "failed": False,
            "exit_code": 1e300,
        },
        "architecture": {"input_modalities": ["text"]},
        "meta": {"n_params": 123456789012345678901234567890, "deep": [[[[{"k": []}]]]]},
    }
    assert parse_models(body({"data": [entry], "models": [{"name": 1}]})) == (
        ["tiny-a"],
        ["tiny-a"],
    )


@pytest.mark.parametrize(
    "model_id",
    [1, 1.5, True, ["tiny-a"], {"id": "tiny-a"}, "", 12345678901234567890123, [[[]]]],
)
def test_an_id_of_any_other_shape_is_skipped(model_id: object) -> None:
    listing = {"data": [{"id": model_id, "status": {"value": "loaded"}}, {"id": "kept"}]}
    assert parse_models(body(listing)) == (["kept"], ["kept"])


@pytest.mark.parametrize("value", [None, 1, ["loaded"], {"value": "loaded"}, "LOADED", ""])
def test_a_status_value_of_any_other_shape_is_not_resident(value: object) -> None:
    assert parse_models(body({"data": [{"id": "m", "status": {"value": value}}]})) == ([], ["m"])


def test_a_status_of_null_is_resident_as_today() -> None:
    assert parse_models(b'{"data": [{"id": "m", "status": null}]}') == (["m"], ["m"])


def test_of_repeated_keys_the_last_wins() -> None:
    text = b'{"data": [], "data": [{"id": 1, "id": "b", "status": {"value": "loaded"}}]}'
    assert parse_models(text) == (["b"], ["b"])


def test_a_huge_id_is_kept_whole() -> None:
    huge = "m" * 1_000_000
    assert parse_models(body({"data": [{"id": huge}]})) == ([huge], [huge])


def test_nesting_too_deep_to_read_is_a_bad_answer_in_words() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for text in (
        b'{"data": [{"id": "m", "meta": ' + deep + b"}]}",
        b'{"data": [], "x": ' + deep + b"}",
        b'{"data": [{"id": ' + deep + b"}]}",
    ):
        with pytest.raises(ValueError, match=r"^nested too deeply$"):
            parse_models(text)


def test_a_number_out_of_range_where_crossbar_reads_is_a_bad_answer_in_words() -> None:
    with pytest.raises(ValueError, match=r"^Number out of range - at `\$\.data\[0\]\.id`$"):
        parse_models(b'{"data": [{"id": 1e999}]}')
    # Where crossbar does not read, it is skipped.
    assert parse_models(b'{"data": [{"id": "m", "created": 1e999}]}') == (["m"], ["m"])


@pytest.mark.parametrize("text", [b'{"data": [], "x": NaN}', b'{"data": []} []', b"\xef\xbb\xbf{}"])
def test_what_is_not_strict_json_is_a_bad_answer(text: bytes) -> None:
    with pytest.raises(ValueError):
        parse_models(text)


def test_a_hundred_thousand_models_are_read() -> None:
    """About 12 MiB: measured at about 30 ms (read with json.loads, 160 to 280 ms)."""
    entries = [
        {
            "id": f"model-{i:06d}",
            "object": "model",
            "owned_by": "llamacpp",
            "created": 1796059518,
            "status": {"value": "loaded" if i % 7 == 0 else "unloaded", "args": ["--port", "0"]},
        }
        for i in range(100_000)
    ]
    loaded, known = parse_models(body({"object": "list", "data": entries}))
    assert known == [entry["id"] for entry in entries]
    assert loaded == known[::7]


def read_whole(text: bytes) -> tuple[list[str], list[str]]:
    """The listing read by building the whole document: what parse_models must agree with."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError("not a list")
    loaded: list[str] = []
    known: list[str] = []
    for entry in doc["data"]:
        if not isinstance(entry, dict):
            raise ValueError("not an entry")
        model_id = entry.get("id")
        if isinstance(model_id, str) and model_id:
            known.append(model_id)
            status = entry.get("status")
            if status is None or (isinstance(status, dict) and status.get("value") == "loaded"):
                loaded.append(model_id)
    return loaded, known


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
ids = st.sampled_from(["tiny-a", "tiny-b", ""]) | json_values
statuses = (
    st.fixed_dictionaries(
        {}, optional={"value": st.sampled_from(["loaded", "unloaded"]) | json_values}
    )
    | json_values
)
entries = st.fixed_dictionaries({}, optional={"id": ids, "status": statuses, "object": json_values})
answers = (
    st.fixed_dictionaries(
        {},
        optional={
            "data": st.lists(entries | json_values, max_size=5) | json_values,
            "object": json_values,
        },
    )
    | json_values
)


@settings(max_examples=300, deadline=None)
@given(answers)
def test_any_answer_is_read_as_the_whole_document_says(doc: object) -> None:
    text = body(doc)
    try:
        expected = read_whole(text)
    except ValueError:
        with pytest.raises(ValueError):
            parse_models(text)
    else:
        assert parse_models(text) == expected


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


# -- read_models: what crossbar keeps of a host's list (issue 27, 3 and 14) ----------------------


def test_a_list_is_kept_to_its_first_1000_models_and_says_how_many_it_had() -> None:
    entries = [{"id": f"m{i:06d}", "status": {"value": "loaded"}} for i in range(5000)]
    models = read_models(body({"data": [{"id": "m000000"}, *entries]}))  # one listed twice
    assert models.known == tuple(f"m{i:06d}" for i in range(MAX_MODELS))
    assert models.loaded == models.known
    assert (models.listed, models.cut, models.dropped) == (5001, True, 0)
    assert models.note == "lists 5,001 models: only the first 1,000 are used"


def test_a_list_within_the_caps_is_kept_whole_with_no_note() -> None:
    models = read_models(body(ROUTER_LISTING))
    assert (list(models.loaded), list(models.known)) == parse_models(body(ROUTER_LISTING))
    assert models.note == ""


@pytest.mark.parametrize(
    "bad",
    [
        "\x1b[31mred",
        "cr\rlf",
        "nul\x00",
        "del\x7f",
        "c1\x9b",
        "m" * (MAX_ID_BYTES + 1),
        "é" * 129,
        "(other)",  # crossbar's own names: a host's model never shares their sums
        "(none)",
    ],
)
def test_an_id_with_a_control_character_or_over_256_bytes_is_dropped_and_counted(bad: str) -> None:
    """Raw ESC and CR bytes reached the page, the status JSON and the metrics' labels."""
    fits = "m" * MAX_ID_BYTES
    models = read_models(body({"data": [{"id": bad}, {"id": "ok"}, {"id": fits}, {"id": "é"}]}))
    assert models.known == ("ok", fits, "é")
    assert models.dropped == 1
    assert models.note == (
        "1 model id dropped (over 256 bytes, with a control character, or one of crossbar's"
        " own names: (other), (none))"
    )


def test_merged_listing_lists_at_most_its_cap() -> None:
    many = tuple(f"m{i:06d}" for i in range(MAX_MODELS))
    states = {
        "gpu-a": _state("gpu-a", (), many),
        "gpu-b": _state("gpu-b", (), tuple(f"n{i:06d}" for i in range(MAX_MODELS))),
    }
    listing = merged_listing(ROUTE, states, now=0)
    assert listing is not None
    assert [entry["id"] for entry in listing["data"]] == list(many[:MAX_MERGED])


# -- windows: the training context read from the list, the slot window told in the merged one --


def test_a_loaded_model_s_training_context_is_read_from_its_meta() -> None:
    doc = {
        "data": [
            {"id": "a", "status": {"value": "loaded"}, "meta": {"n_ctx_train": 262144}},
            {"id": "b", "status": {"value": "unloaded"}},  # meta: running models only
            {"id": "c", "meta": {"n_ctx_train": "big"}},
            {"id": "d", "meta": {"n_ctx_train": 1 << 30}},
            {"id": "e", "meta": [1, 2]},
            {"id": "f", "meta": {"n_ctx_train": 0}},
        ]
    }
    models = read_models(json.dumps(doc).encode())
    assert dict(models.trained) == {"a": 262144}
    assert models.known == ("a", "b", "c", "d", "e", "f")  # a bad meta drops nothing else


def test_merged_listing_tells_the_largest_slot_window_in_the_fields_clients_read() -> None:
    """crossbar sends a prompt where it fits: the largest window of the healthy hosts is
    what the route serves; ``meta.n_ctx_train`` the smallest training context listed."""
    a = HostState(
        name="gpu-a", url="http://a", healthy=True, loaded=("m1",), known=("m1",),
        windows={"m1": 2048}, trained={"m1": 32768},
    )  # fmt: skip
    b = HostState(
        name="gpu-b", url="http://b", healthy=True, loaded=("m1", "m2"), known=("m1", "m2"),
        windows={"m1": 8192}, trained={"m1": 262144},
    )  # fmt: skip
    c = HostState(
        name="gpu-c", url="http://c", healthy=False, loaded=("m1",), known=("m1",),
        windows={"m1": 65536},
    )  # fmt: skip
    listing = merged_listing(ROUTE, {"gpu-a": a, "gpu-b": b, "gpu-c": c}, now=0)
    assert listing is not None
    m1, m2 = listing["data"]
    assert m1["context_length"] == m1["max_input_tokens"] == m1["context_window"] == 8192
    assert m1["max_model_len"] == 8192 and m1["meta"] == {"n_ctx_train": 32768}
    assert "context_length" not in m2 and "meta" not in m2  # unknown: nothing said


def test_merged_listing_lists_each_alias_after_the_models_with_what_it_stands_for() -> None:
    aliased = RouteConfig(
        "lab",
        ("gpu-a",),
        None,
        list_models="merged",
        aliases=(("claude-*", "m1"), ("gpt-5*", "zz")),
    )
    listing = merged_listing(aliased, {"gpu-a": _state("gpu-a", ("m1",), ("m1",))}, 7)
    assert listing is not None
    assert [entry["id"] for entry in listing["data"]] == ["m1", "claude-*", "gpt-5*"]
    claude, gpt = listing["data"][1:]
    assert claude == {
        "id": "claude-*",
        "object": "model",
        "created": 7,
        "owned_by": "gpu-a",
        "status": {"value": "loaded"},
        "alias_of": "m1",
    }
    assert (gpt["alias_of"], gpt["owned_by"], gpt["status"]) == ("zz", "", {"value": "unloaded"})


def test_a_host_s_own_list_gets_the_known_windows_and_keeps_its_own_fields() -> None:
    from crossbar.polling import with_windows

    body = b'{"data":[{"id":"a","context_length":999},{"id":"b"},{"id":7},"x"]}'
    listing = with_windows(body, {"a": 4096, "b": 8192})
    assert listing is not None
    a, b, *_ = listing["data"]
    assert a["context_length"] == 999 and a["max_input_tokens"] == 4096  # the host's own kept
    assert b["max_model_len"] == 8192
    assert with_windows(body, {"c": 1}) is None  # nothing to add
    assert with_windows(b"not json", {"a": 1}) is None
    assert with_windows(b'{"data": {}}', {"a": 1}) is None

"""crossbar.testing.simulator.replies: llama-server's own bodies, byte for byte: its errors,
its model lists in router and single-model mode, and its props."""

from __future__ import annotations

import json

import attrs
import pytest

from crossbar.testing.simulator.replies import (
    BUILD_INFO,
    META,
    HttpError,
    dumps,
    error_body,
    json_object,
    model_props,
    router_models,
    router_props,
    single_models,
)


@attrs.frozen
class Model:
    id: str
    status: str
    port: int = 40001
    failed: bool = False


def test_json_is_compact_and_keeps_unicode() -> None:
    assert dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'),
        (503, b'{"error":{"code":503,"message":"bad","type":"unavailable_error"}}'),
        (500, b'{"error":{"code":500,"message":"bad","type":"server_error"}}'),
        (404, b'{"error":{"message":"bad","type":"not_found_error","code":404}}'),
    ],
)
def test_errors_have_llama_servers_shape_and_key_order(status: int, body: bytes) -> None:
    assert error_body(status, "bad") == body


def test_a_body_that_is_not_a_json_object_is_refused_as_llama_server_does() -> None:
    assert json_object(b'{"model":"m"}') == {"model": "m"}
    with pytest.raises(HttpError) as not_json:
        json_object(b"{")
    assert not_json.value.status == 500
    assert not_json.value.message.startswith("[json.exception.parse_error.101] parse error:")
    with pytest.raises(HttpError) as a_list:
        json_object(b"[1]")
    assert (a_list.value.status, a_list.value.message) == (
        400,
        "request body must be a JSON object",
    )


def test_a_routers_list_gives_each_models_status_and_meta_only_when_loaded() -> None:
    listed = router_models(
        [
            Model("a", "loaded"),
            Model("b", "unloaded"),
            Model("c", "unloaded", failed=True),
            Model("d", "loading"),
        ],
        7,
    )
    a, b, c, d = listed["data"]
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["a", "b", "c", "d"]
    assert "meta" not in d  # only a running model can tell its metadata
    assert a["status"]["value"] == "loaded" and a["meta"] == META
    assert "meta" not in b and b["status"]["value"] == "unloaded"
    assert c["status"]["failed"] is True and c["status"]["exit_code"] == 1
    assert "--port" in a["status"]["args"] and "40001" in a["status"]["args"]
    assert a["created"] == 7


def test_a_single_model_server_lists_its_one_model_in_both_shapes() -> None:
    listed = single_models("tiny", 7)
    assert [m["name"] for m in listed["models"]] == ["tiny"]
    assert [m["id"] for m in listed["data"]] == ["tiny"]
    assert "status" not in listed["data"][0]


def test_props_say_a_routers_room_and_a_models_slots() -> None:
    assert router_props(3)["max_instances"] == 3
    assert router_props(3)["role"] == "router"
    props = model_props("tiny", 4)
    assert props["total_slots"] == 4 and props["build_info"] == BUILD_INFO
    assert json.loads(dumps(props)) == props

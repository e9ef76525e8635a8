"""crossbar.proxy.demand: what one request asks of crossbar, read once from its target,
head and body: its route, the model hosts are chosen by, what goes to the host."""

from __future__ import annotations

import json
from io import BytesIO

import pytest
from twisted.web.test.requesthelper import DummyRequest

from crossbar.config import parse_config
from crossbar.http import BadTarget
from crossbar.proxy.demand import Asked, read_request, route_of

CONFIG = parse_config(
    {
        "hosts": {"gpu-a": "http://127.0.0.1:18081"},
        "routes": {
            "lab": {"hosts": ["gpu-a"], "default_model": "qwen"},
            "keyed": {"hosts": ["gpu-a"], "api_keys": ["sekrit-key"]},
        },
    }
)


Body = dict[str, object] | bytes


class Request(DummyRequest):
    """A request as twisted.web gives it, on a plain connection."""

    def isSecure(self) -> bool:
        return False


def post(path: bytes, body: Body, *headers: tuple[bytes, bytes]) -> DummyRequest:
    request = Request(path.split(b"/")[1:])
    request.method = b"POST"
    request.uri = request.path = path
    request.content = BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
    for name, value in headers:
        request.requestHeaders.addRawHeader(name, value)
    return request


def read(path: bytes, body: Body, *headers: tuple[bytes, bytes]) -> Asked:
    route, target, shape = route_of(CONFIG, path)
    assert shape is not None
    return read_request(post(path, body, *headers), CONFIG, route, target, shape, True)


def test_a_target_names_its_route_and_the_shape_of_its_path() -> None:
    route, target, shape = route_of(CONFIG, b"/lab/v1/chat/completions?x=1")
    assert route.name == "lab"
    assert target.rest == b"/v1/chat/completions" and target.query == b"x=1"
    assert shape is not None and shape.name == "chat"
    assert route_of(CONFIG, b"/lab/v1/not-an-api")[2] is None


def test_an_unknown_route_is_a_404_in_words() -> None:
    with pytest.raises(BadTarget) as refused:
        route_of(CONFIG, b"/nope/v1/chat/completions")
    assert refused.value.status == 404
    assert "unknown route" in str(refused.value)


def test_the_body_s_model_chooses_the_host_and_goes_as_it_came() -> None:
    body = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 99}
    asked = read(b"/lab/v1/chat/completions", body)
    assert asked.model == asked.asked == "gemma"
    assert asked.body is not None and json.loads(asked.body) == body
    assert asked.url_rest == b"/v1/chat/completions"
    assert asked.reply_limit == 99


def test_a_body_without_a_model_gets_the_route_s_default() -> None:
    asked = read(b"/lab/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert asked.model == asked.asked == "qwen"
    assert asked.body is not None and json.loads(asked.body)["model"] == "qwen"


def test_a_client_s_key_for_crossbar_never_goes_to_a_host() -> None:
    auth = (b"authorization", b"Bearer sekrit-key")
    keyed = read(b"/keyed/v1/chat/completions", {"model": "m"}, auth)
    assert b"sekrit-key" not in keyed.headers + keyed.credentials
    open_route = read(b"/lab/v1/chat/completions", {"model": "m"}, auth)
    assert b"sekrit-key" in open_route.credentials  # a route without keys passes it on


def test_a_body_that_is_not_json_goes_on_with_no_model_read() -> None:
    asked = read(b"/lab/v1/chat/completions", b"not json")
    assert asked.asked is None
    assert asked.model == "qwen"  # hosts are still chosen by the route's default
    assert asked.body == b"not json"

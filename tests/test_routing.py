"""Routing decisions: route and path parsing, model peeking, and the choice of host."""

from __future__ import annotations

import json

import pytest

from crossbar.fleet import HostState, choose
from crossbar.server.rewrite import BadTarget, allowed_path, parse_target, peek_model, with_model


@pytest.mark.parametrize(
    ("uri", "route", "rest", "query"),
    [
        (b"/a/v1/x", "a", b"/v1/x", b""),
        (b"/a", "a", b"/", b""),
        (b"/a/", "a", b"/", b""),
        (b"/a/v1/models?x=1&y=2", "a", b"/v1/models", b"x=1&y=2"),
        (b"/a?x", "a", b"/", b"x"),
    ],
)
def test_parse_target(uri: bytes, route: str, rest: bytes, query: bytes) -> None:
    target = parse_target(uri)
    assert (target.route, target.rest, target.query) == (route, rest, query)


@pytest.mark.parametrize("uri", [b"/", b"//x", b"/?a=1", b"", b"http://h/a/v1/x"])
def test_missing_route(uri: bytes) -> None:
    with pytest.raises(BadTarget, match="missing route") as info:
        parse_target(uri)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("rest", "ok"),
    [
        (b"/v1/chat/completions", True),
        (b"/v1/models", True),
        (b"/health", True),
        (b"/props", True),
        (b"/v1", False),
        (b"/slots", False),
        (b"/metrics", False),
        (b"/health/x", False),
        (b"/models/load", False),
        (b"/", False),
    ],
)
def test_allowed_paths(rest: bytes, ok: bool) -> None:
    assert allowed_path(rest) is ok


def test_peek_model() -> None:
    assert peek_model(b'{"model": "m1", "messages": []}').model == "m1"
    # A "model" inside a message never fools the peek.
    fooled = peek_model(b'{"messages": [{"content": "\\"model\\": \\"evil\\""}], "model": "m2"}')
    assert fooled.model == "m2"
    nested = peek_model(b'{"messages": [{"model": "inner"}]}')
    assert (nested.model, nested.missing) == (None, True)
    for body in (b"not json", b"[1, 2]", b'"model"', b"", b"{broken"):
        assert (peek_model(body).model, peek_model(body).missing) == (None, False)
    for body in (b'{"model": null}', b'{"model": ""}', b'{"model": 3}'):
        assert (peek_model(body).model, peek_model(body).missing) == (None, False)


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "hi"}]}',
        b'  {\n  "stream": true\n}\n',
        b"{}",
        b"{ }",
    ],
)
def test_with_model_keeps_every_other_byte(body: bytes) -> None:
    out = with_model(body, "qwen")
    doc = json.loads(out)
    assert doc["model"] == "qwen"
    original = json.loads(body)
    assert {k: v for k, v in doc.items() if k != "model"} == original
    assert out.replace(b'"model":"qwen",', b"").replace(b'"model":"qwen"', b"") == body


def state(
    name: str, healthy: bool = True, loaded: tuple[str, ...] = (), known: tuple[str, ...] = ()
) -> HostState:
    return HostState(
        name=name, url=f"http://{name}", healthy=healthy, loaded=loaded, known=known + loaded
    )


def test_choice_prefers_loaded_then_known_then_healthy() -> None:
    states = {
        "a": state("a", known=("m1", "m2")),
        "b": state("b", loaded=("m2",)),
        "c": state("c", healthy=False, loaded=("m1", "m3")),
        "d": state("d", known=("m4",)),
    }
    order = ["a", "b", "c", "d"]
    assert choose(order, "m2", states) == "b"  # loaded wins over earlier host that only knows it
    assert choose(order, "m1", states) == "a"  # c has it loaded but is down; a knows it
    assert choose(order, "m4", states) == "d"  # only d knows it
    assert choose(order, "m9", states) == "a"  # nobody knows it: first healthy
    assert choose(order, None, states) == "a"
    assert choose(["c"], "m1", states) is None
    assert choose(["b", "a"], "m1", states) == "a"
    assert choose(["b", "a"], "m9", states) == "b"  # order of the route decides

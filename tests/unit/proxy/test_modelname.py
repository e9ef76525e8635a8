"""crossbar.proxy.modelname: which model a request's body asks for, and the route's default
model filled in. Pure rules, called directly; properties checked with hypothesis against
``json.loads``, which reads duplicate keys the way llama-server does (the last wins)."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossbar.proxy.modelname import peek_model, renamed, with_model

BOM = b"\xef\xbb\xbf"
MiB = 1024 * 1024


def seen(body: bytes) -> tuple[str | None, bool]:
    peek = peek_model(body)
    return peek.model, peek.missing


def test_the_top_level_model_is_found() -> None:
    assert seen(b'{"model": "m1", "messages": []}') == ("m1", False)
    assert seen(b'{"messages": [], "model": "m1"}') == ("m1", False)
    assert seen(b'{"model": "caf\\u00e9"}') == ("caf\u00e9", False)
    assert seen('{"model": "caf\u00e9"}'.encode()) == ("caf\u00e9", False)
    assert seen(b'{"mod\\u0065l": "escaped-key"}') == ("escaped-key", False)


def test_a_model_inside_the_body_never_fools_the_peek() -> None:
    fooled = b'{"messages": [{"content": "\\"model\\": \\"evil\\""}], "model": "m2"}'
    assert seen(fooled) == ("m2", False)
    assert seen(b'{"messages": [{"model": "inner"}]}') == (None, True)
    assert seen(b'{"Model": "m", "models": ["m"]}') == (None, True)


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'"model"', b"", b"{broken", b"null", b'{"model": "m"} x'],
)
def test_a_body_that_is_not_a_json_object_names_no_model(body: bytes) -> None:
    assert seen(body) == (None, False)


@pytest.mark.parametrize(
    "body",
    [b'{"model": null}', b'{"model": ""}', b'{"model": 3}', b'{"model": ["m"]}', b'{"model": {}}'],
)
def test_a_model_that_is_not_a_name_is_no_model_and_not_missing(body: bytes) -> None:
    """The default model is filled in only where no "model" key is at all."""
    assert seen(body) == (None, False)


def test_of_two_model_keys_the_last_wins_as_in_llama_server() -> None:
    assert seen(b'{"model": "first", "messages": [], "model": "last"}') == ("last", False)
    assert seen(b'{"model": "first", "model": null}') == (None, False)
    assert seen(b'{"model": 1, "model": "last"}') == ("last", False)


def test_json_whitespace_and_a_utf8_bom_are_read_through() -> None:
    assert seen(b' \t\r\n{ "model" : "m" } \r\n') == ("m", False)
    assert seen(BOM + b'{"model": "m"}') == ("m", False)
    assert seen(BOM + b" {}") == (None, True)
    # Anything else before the object is not JSON (llama-server refuses it too).
    assert seen(b'\x0c{"model": "m"}') == (None, False)
    assert seen(BOM + BOM + b'{"model": "m"}') == (None, False)
    assert seen(b'\xff\xfe{\x00"\x00m\x00') == (None, False)  # UTF-16 is not read


def test_bytes_that_are_not_utf8_spoil_only_a_model_made_of_them() -> None:
    assert seen(b'{"model": "caf\xe9"}') == (None, False)
    assert seen(b'{"model": "\xed\xa0\x80"}') == (None, False)  # an encoded surrogate
    # Elsewhere they are not looked for: the host refuses such a body itself.
    assert seen(b'{"x": "\xff", "model": "m"}') == ("m", False)


def test_nesting_too_deep_to_read_is_no_model_never_an_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert seen(b'{"model": "m", "x": ' + deep + b"}") == (None, False)
    assert seen(b'{"x": ' + deep + b"}") == (None, False)
    assert seen(deep) == (None, False)
    # Ordinary depth is read.
    nested = b"[" * 200 + b"]" * 200
    assert seen(b'{"x": ' + nested + b', "model": "m"}') == ("m", False)


def million_arrays(model: bytes = b'"m"') -> bytes:
    """About 15 MiB: the body that froze the proxy for seconds when read with json.loads."""
    return b'{"model": %s, "messages": [], "x": [%s[1,2]]}' % (model, b"[1,2]," * 2_600_000)


def peak_bytes(call: Any, *args: Any) -> tuple[Any, int]:
    """The result of ``call(*args)`` and the most memory Python allocated during it."""
    tracemalloc.start()
    try:
        result = call(*args)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_15_mib_body_of_a_million_arrays_is_read_without_building_it() -> None:
    body = million_arrays()
    assert len(body) > 14 * MiB
    peek, peak = peak_bytes(peek_model, body)
    assert (peek.model, peek.missing) == ("m", False)
    assert peak < 64 * 1024, f"peeking allocated {peak} bytes"
    # A huge non-string model costs nothing either.
    peek, peak = peak_bytes(peek_model, million_arrays(b"[" + b"[1,2]," * 100_000 + b"[]]"))
    assert (peek.model, peek.missing) == (None, False)
    assert peak < 64 * 1024, f"peeking allocated {peak} bytes"


def test_with_model_on_a_15_mib_body_makes_one_copy() -> None:
    body = million_arrays().replace(b'"model": "m", ', b"", 1)
    out, peak = peak_bytes(with_model, body, "qwen")
    assert out.startswith(b'{"model":"qwen","messages"') and out.endswith(body[1:])
    assert len(body) < peak < len(body) + 64 * 1024


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "hi"}]}',
        b'  {\n  "stream": true\n}\n',
        b"{}",
        b"{ }",
        b"{\r\n\t}",
        BOM + b"{}",
    ],
)
def test_with_model_keeps_every_other_byte(body: bytes) -> None:
    out = with_model(body, "qwen")
    doc = json.loads(out)
    assert doc["model"] == "qwen"
    original = json.loads(body)
    assert {k: v for k, v in doc.items() if k != "model"} == original
    assert out.replace(b'"model":"qwen",', b"").replace(b'"model":"qwen"', b"") == body


def test_with_model_escapes_the_name() -> None:
    assert with_model(b"{}", 'a"b') == b'{"model":"a\\"b"}'
    assert with_model(b"{}", "caf\u00e9\n") == b'{"model":"caf\\u00e9\\n"}'


# -- properties -------------------------------------------------------------------------------

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(["model", "messages", "Model", "mode", "models", ""]) | st.text()
spaces = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])


@st.composite
def json_objects(draw: st.DrawFn, keys: st.SearchStrategy[str] = keys) -> bytes:
    """A JSON object written by hand, so that keys may repeat (``"model"`` often among
    them), with any JSON whitespace, escaped or raw non-ASCII text, and maybe a BOM."""
    pairs = draw(st.lists(st.tuples(keys, values), max_size=6))
    ascii_only = draw(st.booleans())
    gap = draw(spaces)

    def dump(value: object) -> str:
        return json.dumps(value, ensure_ascii=ascii_only)

    members = [f"{gap}{dump(k)}{draw(spaces)}:{gap}{dump(v)}" for k, v in pairs]
    text = "{" + ",".join(members) + gap + "}"
    body = draw(spaces).encode() + text.encode() + draw(spaces).encode()
    return (BOM + body) if draw(st.booleans()) else body


def expected(body: bytes) -> tuple[str | None, bool]:
    doc = json.loads(body)  # detects a BOM; of repeated keys keeps the last
    if "model" not in doc:
        return None, True
    model = doc["model"]
    return (model if isinstance(model, str) and model else None), False


@PROPERTY
@given(st.binary(max_size=300))
def test_any_bytes_never_raise(body: bytes) -> None:
    peek = peek_model(body)
    assert peek.model is None or isinstance(peek.model, str)


@PROPERTY
@given(json_objects(), st.data())
def test_any_cut_or_spoiled_object_never_raises(body: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(body)))
    junk = data.draw(st.binary(max_size=8))
    for spoiled in (body[:cut], body[:cut] + junk + body[cut:], body[:cut] + body[cut + 1 :]):
        peek_model(spoiled)


@PROPERTY
@given(json_objects())
def test_the_peek_agrees_with_json_loads(body: bytes) -> None:
    assert seen(body) == expected(body)


@PROPERTY
@given(json_objects(keys.filter(lambda key: key != "model")), st.text())
def test_with_model_adds_the_model_and_keeps_the_object(body: bytes, model: str) -> None:
    assert peek_model(body).missing
    out = with_model(body, model)
    doc = json.loads(out)
    assert doc == {**json.loads(body), "model": model}
    assert next(iter(doc)) == "model"
    assert seen(out) == ((model or None), False)


def test_an_alias_s_model_is_rewritten_in_place_keeping_every_other_byte() -> None:
    body = b'{"model" : "claude-x", "messages": [1]}'
    assert renamed(body, "claude-x", "qwen") == b'{"model":"qwen", "messages": [1]}'
    assert peek_model(renamed(body, "claude-x", "qwen")).model == "qwen"


def test_a_model_written_twice_or_escaped_gets_a_last_key_the_host_reads() -> None:
    nested = b'{"model":"c","meta":{"model":"c"}}\n'
    assert renamed(nested, "c", "q") == b'{"model":"c","meta":{"model":"c"},"model":"q"}\n'
    escaped = b'{"model":"c\\u002dx"}'
    assert peek_model(renamed(escaped, "c-x", "q")).model == "q"

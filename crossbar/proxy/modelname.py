"""Which model a request's body asks for, and the route's default model filled in.

The proxy needs one value of a body that may be 16 MiB of anything a client sends, on
the reactor thread. Building the document (``json.loads``) would freeze every other
request for seconds and take hundreds of megabytes for a body of a million small arrays;
msgspec reads only the top-level ``"model"`` and skips the rest in C, without building
it. What counts as the model follows llama-server (nlohmann::json), which is what reads
the body next:

- a UTF-8 byte order mark before the object is skipped, as llama-server does; JSON
  whitespace around it is fine; nothing else is (no ``NaN``, no trailing data);
- of two top-level ``"model"`` keys the last one wins, as in llama-server;
- a body that is not a JSON object, is not valid JSON, or nests deeper than Python's
  recursion limit (about 900 levels) is "no model": never an error here. The body then
  goes to the host unchanged, and the host says what is wrong with it;
- bytes that are not UTF-8 make the model itself unreadable ("no model"); elsewhere in
  the body they are not looked for (the host refuses such a body itself).

Pure rules, no I/O.
"""

from __future__ import annotations

import json
import re

import attrs
import msgspec

_BOM = b"\xef\xbb\xbf"
_CLOSING = re.compile(rb"[ \t\r\n]*\}")


class _Top(msgspec.Struct):
    """The one field read; every other key is skipped without being built."""

    model: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """Its JSON text, a view into the body: a huge non-string costs nothing either."""


_DECODER = msgspec.json.Decoder(_Top)


@attrs.frozen
class Peek:
    model: str | None
    """The top-level ``"model"`` string, when the body is a JSON object naming one."""
    missing: bool
    """The body is a JSON object with no top-level ``"model"`` key at all."""


_NOTHING = Peek(model=None, missing=False)
_MISSING = Peek(model=None, missing=True)


def peek_model(body: bytes) -> Peek:
    """The top-level ``"model"`` of a JSON body; anything else is "no model", never raised."""
    try:
        top = _DECODER.decode(json_view(body))
    except (msgspec.MsgspecError, RecursionError):
        return _NOTHING
    return model_of(top.model)


def json_view(body: bytes) -> memoryview:
    """The body as a JSON decoder should read it: past a UTF-8 byte order mark, as
    llama-server skips one."""
    view = memoryview(body)
    return view[len(_BOM) :] if body.startswith(_BOM) else view


def model_of(raw: msgspec.Raw | msgspec.UnsetType) -> Peek:
    """What a decoded object's ``"model"`` (its JSON text, if it has the key) says."""
    if raw is msgspec.UNSET:
        return _MISSING
    try:  # fails at the first byte of a null, a number, an array...: not a name
        model = msgspec.json.decode(raw, type=str)
    except msgspec.MsgspecError:
        return _NOTHING
    return Peek(model or None, False)


NOTHING = _NOTHING
"""A body that is not a JSON object (or not one that can be read): no model, none missing."""


def with_model(body: bytes, model: str) -> bytes:
    """Add ``"model"`` right after the opening brace, keeping every other byte.

    ``body`` is a JSON object (:func:`peek_model` said ``missing``). The answer is the
    one copy of the body made here: the rest is joined from a view, not sliced out.
    """
    brace = body.index(b"{") + 1
    field = b'"model":' + json.dumps(model).encode()
    empty = _CLOSING.match(body, brace) is not None
    return b"".join((body[:brace], field, b"" if empty else b",", memoryview(body)[brace:]))


def renamed(body: bytes, old: str, new: str) -> bytes:
    """The body with its top-level ``"model"`` (``old``, :func:`peek_model` read it) set to
    ``new``, every other byte kept: in place where the key and value are found once as
    JSON writes them; else (written twice, or escaped) a last ``"model"`` is added, which
    is the one llama-server reads. Only a request whose name an alias maps is rewritten."""
    value = json.dumps(new).encode()
    sent = re.escape(json.dumps(old, ensure_ascii=False).encode())
    written = re.compile(rb'"model"[ \t\r\n]*:[ \t\r\n]*' + sent)
    found = written.finditer(body)
    first = next(found, None)
    if first is not None and next(found, None) is None:
        start, end = first.span()
        return b"".join((body[:start], b'"model":', value, memoryview(body)[end:]))
    close = body.rindex(b"}")
    return b"".join((body[:close], b',"model":', value, memoryview(body)[close:]))

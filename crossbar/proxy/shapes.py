"""The API paths crossbar forwards, and how to read each one's request body.

One table: for each path, whether its body is JSON naming a model (the route's default
model is filled into it) and, for the APIs whose requests continue a conversation, how to
find that conversation (its key and turn, for ``cache_affinity``). A body is decoded once,
by msgspec, reading only the fields its shape names and skipping the rest in C: the model,
the stream flag, the answer's token limit and, when the route's policy asks, the
conversation's fields.

A path not in the table is not forwarded (404): llama-server has endpoints a shared
proxy must not pass on, such as its resumable stream sessions (``/v1/stream``), which
would let one key holder replay or end another's answer and keep a GPU generating after
its client left. A new API is one entry here. Pure rules, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

import attrs
import msgspec

from crossbar.proxy.conversation import (
    ERRORS,
    anthropic_conversation,
    chat_conversation,
    completion_conversation,
    responses_conversation,
)
from crossbar.proxy.modelname import NOTHING, Peek, json_view, model_of
from crossbar.routing.policies import Conversation


class _Plain(msgspec.Struct):
    """The fields every JSON body is read for; every other key is skipped unbuilt."""

    model: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """Its JSON text, a view into the body: a huge non-string costs nothing either."""
    stream: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    n_predict: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    max_completion_tokens: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    max_tokens: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    max_output_tokens: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """The answer's token limit: llama-server reads the first three in this order on every
    completion endpoint; Responses names it ``max_output_tokens``."""


_LIMITS = ("n_predict", "max_completion_tokens", "max_tokens", "max_output_tokens")
_LIMIT = re.compile(rb"[0-9]{1,9}")
"""A limit crossbar reads: a plain non-negative integer (a larger one is no limit it needs)."""


def _reply_limit(top: _Plain) -> int | None:
    """The first limit given as a plain integer; ``None`` when none is (``-1`` and the
    like: no limit)."""
    for name in _LIMITS:
        raw = getattr(top, name)
        if raw is not msgspec.UNSET:
            text = bytes(raw)
            return int(text) if _LIMIT.fullmatch(text) else None
    return None


class _Chat(_Plain):
    messages: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    tools: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Completion(_Plain):
    prompt: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Anthropic(_Plain):
    system: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    messages: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    tools: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Responses(_Plain):
    instructions: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    input: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    tools: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


@attrs.frozen
class BodyFacts:
    """What crossbar reads of a request's body."""

    peek: Peek
    """Its model, or that it has none (:func:`crossbar.proxy.modelname.peek_model`'s rules)."""
    stream: bool = False
    """It asks for a streamed answer (``"stream": true``)."""
    conversation: Conversation | None = None
    """The conversation it continues, when asked for and its API has one."""
    reply_limit: int | None = None
    """The tokens its answer may take at most, as it asks (``max_tokens`` and the like)."""


NO_FACTS = BodyFacts(NOTHING)


def _tools(body: Any) -> msgspec.Raw | None:
    return None if body.tools is msgspec.UNSET else body.tools  # type: ignore[no-any-return]


def _read_chat(model: str | None, body: Any) -> Conversation | None:
    messages = body.messages
    return None if messages is msgspec.UNSET else chat_conversation(model, messages, _tools(body))


def _read_completion(model: str | None, body: Any) -> Conversation | None:
    prompt = body.prompt
    return None if prompt is msgspec.UNSET else completion_conversation(model, prompt)


def _read_anthropic(model: str | None, body: Any) -> Conversation | None:
    if body.messages is msgspec.UNSET:
        return None
    system = None if body.system is msgspec.UNSET else body.system
    return anthropic_conversation(model, system, body.messages, _tools(body))


def _read_responses(model: str | None, body: Any) -> Conversation | None:
    if body.input is msgspec.UNSET:
        return None
    instructions = None if body.instructions is msgspec.UNSET else body.instructions
    return responses_conversation(model, instructions, body.input, _tools(body))


@attrs.frozen
class Shape:
    """How crossbar reads the request bodies of one API path."""

    name: str
    names_model: bool = True
    """Its body is a JSON object with a top-level ``"model"``."""
    decoder: msgspec.json.Decoder[Any] | None = None
    """Reads the fields of a body with a conversation, in the same pass as the model."""
    conversation: Callable[[str | None, Any], Conversation | None] | None = None
    """Finds the conversation in what :attr:`decoder` read."""
    generates: bool = True
    """A POST to it takes one of the host's slots while it runs (generation, embeddings,
    reranking, transcription): only such a request waits for a slot and counts as one.
    Listing models, counting tokens, health and props take none."""

    def uses_slot(self, method: bytes | None) -> bool:
        """Whether a request with ``method`` to this path takes a slot: a POST that
        generates (an OPTIONS, a GET or a HEAD never does)."""
        return self.generates and method == b"POST"


_PLAIN = msgspec.json.Decoder(_Plain)
CHAT = Shape("chat", decoder=msgspec.json.Decoder(_Chat), conversation=_read_chat)
COMPLETION = Shape(
    "completion", decoder=msgspec.json.Decoder(_Completion), conversation=_read_completion
)
ANTHROPIC = Shape(
    "anthropic", decoder=msgspec.json.Decoder(_Anthropic), conversation=_read_anthropic
)
RESPONSES = Shape(
    "responses", decoder=msgspec.json.Decoder(_Responses), conversation=_read_responses
)
_MODEL = Shape("model")
NATIVE_COMPLETION = Shape(
    "native completion", decoder=msgspec.json.Decoder(_Completion), conversation=_read_completion
)
"""llama-server's own ``/completion``: a prompt, placed by it like ``/v1/completions``."""
_NATIVE = Shape("native")
"""llama-server's own stateless endpoints (infill, tokenize...): a body naming a model."""
_NATIVE_TOOL = Shape("native tool", generates=False)
"""llama-server's tokenize, detokenize and apply-template: a model's text tools, no slot."""
MODEL_ENTRY = Shape("model entry", names_model=False, generates=False)
"""``GET /v1/models/{id}``: the model is in the path (:func:`model_in_path`)."""
_COUNT = Shape("count", generates=False)
"""Counts a prompt's tokens (names a model, takes no slot)."""
_NO_BODY = Shape("no body", names_model=False, generates=False)
_FORM = Shape("form", names_model=False)
"""A multipart form (a transcription): forwarded as it is."""

SHAPES: Mapping[bytes, Shape] = {
    b"/v1/chat/completions": CHAT,
    b"/v1/completions": COMPLETION,
    b"/v1/chat/completions/input_tokens": _COUNT,
    b"/v1/messages": ANTHROPIC,
    b"/v1/messages/count_tokens": _COUNT,
    b"/v1/responses": RESPONSES,
    b"/v1/responses/input_tokens": _COUNT,
    b"/v1/embeddings": _MODEL,
    b"/v1/rerank": _MODEL,
    b"/v1/reranking": _MODEL,
    b"/v1/audio/transcriptions": _FORM,
    b"/v1/models": _NO_BODY,
    b"/completion": NATIVE_COMPLETION,
    b"/completions": NATIVE_COMPLETION,
    b"/infill": _NATIVE,
    b"/tokenize": _NATIVE_TOOL,
    b"/detokenize": _NATIVE_TOOL,
    b"/apply-template": _NATIVE_TOOL,
    b"/embedding": _NATIVE,
    b"/embeddings": _NATIVE,
    b"/rerank": _NATIVE,
    b"/reranking": _NATIVE,
    b"/v1/health": _NO_BODY,
    b"/health": _NO_BODY,
    b"/props": _NO_BODY,
}
"""Every path crossbar forwards (the route's part of it), with its body's shape; and
``/v1/models/{id}`` (:func:`shape_of`). llama-server's ``/slots``, ``/lora-adapters``
and ``/metrics`` change or show a host's state, not a model's answer: not forwarded."""

_MODEL_PREFIX = MODEL_ENTRY_PATH = b"/v1/models/"
"""The path of ``GET /v1/models/{id}`` up to the id."""


def shape_of(rest: bytes) -> Shape | None:
    """The shape of a request to ``rest`` (the route's part of the path), ``None`` for
    a path crossbar does not forward."""
    shape = SHAPES.get(rest)
    if shape is None and rest.startswith(_MODEL_PREFIX) and len(rest) > len(_MODEL_PREFIX):
        return MODEL_ENTRY
    return shape


def model_in_path(rest: bytes) -> str | None:
    """The model ``GET /v1/models/{id}`` asks about (percent-decoded), if it is one."""
    if not rest.startswith(_MODEL_PREFIX):
        return None
    name = unquote_to_bytes(rest[len(_MODEL_PREFIX) :])
    try:
        return name.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


def read_body(
    shape: Shape,
    body: bytes,
    model: str | None,
    conversations: bool,
    real: Callable[[str], str] | None = None,
) -> BodyFacts:
    """What ``body`` says, decoded once; its conversation only when ``conversations``
    (the route's policy places by it) and the shape has one. ``model`` is the route's
    default, for a body that names none (the key is the model the request is for, as
    ``real`` maps the name the body gives: a route's aliases)."""
    if not shape.names_model or not body:
        return NO_FACTS
    wanted = conversations and shape.decoder is not None
    decoder = shape.decoder if wanted and shape.decoder is not None else _PLAIN
    try:
        top = decoder.decode(json_view(body))
    except ERRORS:
        return NO_FACTS
    peek = model_of(top.model)
    stream = top.stream is not msgspec.UNSET and bytes(top.stream) == b"true"
    conversation = None
    if wanted and shape.conversation is not None:
        named = peek.model if real is None or peek.model is None else real(peek.model)
        conversation = shape.conversation(named or model, top)
    return BodyFacts(peek, stream, conversation, _reply_limit(top))


def read_conversation(path: bytes, body: bytes, model: str | None) -> Conversation | None:
    """The conversation of a request to ``path`` (the route's part) with ``body``, for a
    request for ``model`` (the route's default filled in), or ``None``."""
    shape = shape_of(path)
    if shape is None:
        return None
    return read_body(shape, body, model, conversations=True).conversation


def not_found(route: str, rest: bytes) -> str:
    """The 404 of a path of ``route`` crossbar does not forward (``rest``: the route's part),
    naming the right one when the path is a forwarded one with ``/v1`` left out or doubled:
    ``not found: did you mean /opencode/v1/chat/completions?``."""
    for guess in (b"/v1" + rest, rest[3:] if rest.startswith(b"/v1/v1/") else b""):
        if guess.startswith(b"/v1/") and shape_of(guess) is not None:
            return f"not found: did you mean /{route}{guess.decode()}?"
    return "not found"

"""A host's refusal of a prompt longer than its slot's window, recognised: no I/O.

llama-server answers such a prompt, on every API and streamed or not, before any token
and before its head, with the same OpenAI-shaped error (``tools/server``, its
``exceed_context_size_error``)::

    400 {"error": {"code": 400, "message": "request (3528 tokens) exceeds the available
         context size (2048 tokens), try increasing it", "type": "exceed_context_size_error",
         "n_prompt_tokens": 3528, "n_ctx": 2048}}

Nothing has reached the client when it comes: the proxy may send the request to a host
whose window fits ``n_prompt_tokens`` (the host's own count), learn the refusing host's
window (``n_ctx``), or, when no host fits, answer in the client's API's own words
(:func:`crossbar.http.too_long_payload`). Only a ``400`` of at most
:data:`MAX_REFUSAL_BYTES` is read for it; anything else is not a refusal of this kind.
"""

from __future__ import annotations

import attrs
import msgspec

MAX_REFUSAL_BYTES = 4096
"""Longest answer read as a refusal (a real one is about 220 bytes)."""
MAX_TOKENS = 1 << 30
"""Larger counts are not believed."""
REFUSAL_TYPE = "exceed_context_size_error"


@attrs.frozen
class Overflow:
    """A host's refusal: the prompt's tokens as it counted them, and its slot's window."""

    prompt_tokens: int
    window: int


class _Error(msgspec.Struct, gc=False):
    type: str | int | float | bool | msgspec.Raw | None = None
    n_prompt_tokens: int | float | str | bool | msgspec.Raw | None = None
    n_ctx: int | float | str | bool | msgspec.Raw | None = None


class _Answer(msgspec.Struct, gc=False):
    error: _Error | str | int | float | bool | list[msgspec.Raw] | None = None


_ANSWER = msgspec.json.Decoder(_Answer)


def may_be_refusal(status: int, length: int | None) -> bool:
    """Whether an answer's head may be a refusal worth reading the body of: a ``400``
    whose length is unknown (chunked, as a router relays) or at most
    :data:`MAX_REFUSAL_BYTES`."""
    return status == 400 and (length is None or length <= MAX_REFUSAL_BYTES)


def read_overflow(status: int, body: bytes) -> Overflow | None:
    """The refusal an answer is, or ``None``: a ``400`` whose ``error.type`` is
    ``exceed_context_size_error`` with integer ``n_prompt_tokens`` and ``n_ctx`` (each 1
    to :data:`MAX_TOKENS`)."""
    if status != 400 or len(body) > MAX_REFUSAL_BYTES:
        return None
    try:
        error = _ANSWER.decode(body).error
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if not isinstance(error, _Error) or error.type != REFUSAL_TYPE:
        return None
    prompt, window = error.n_prompt_tokens, error.n_ctx
    if type(prompt) is not int or type(window) is not int:
        return None
    if not (1 <= prompt <= MAX_TOKENS and 1 <= window <= MAX_TOKENS):
        return None
    return Overflow(prompt, window)

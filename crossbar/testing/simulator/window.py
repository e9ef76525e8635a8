"""A slot's window (its context size), as a llama-server keeps it: what it says of it and
how it refuses a prompt too long for it.

Pure data, no Twisted. llama-server divides ``-c`` among its ``-np`` slots; each model's
window here is the window of one slot (``ctx``, a number for every model or one per model;
``None``: no window, every prompt fits, as the simulator was before). It shows as the
model's ``/props`` ``default_generation_settings.n_ctx``, and in ``/v1/models`` as ``meta``:
``n_ctx`` (the whole context, window times slots) and ``n_ctx_train`` (the training
context, here never less than the whole context: llama-server caps ``-c`` at it).

A prompt is counted as the prompt cache counts it (``cache.prompt_tokens``: the start token
and the rendered template's pieces); one of as many tokens as the window or more is refused
as llama.cpp 0c1e57098 refuses it (``server-context.cpp``: ``n_tokens >= n_ctx``), on every
API, streamed or not, before any head::

    400 {"error":{"code":400,"message":"request (3528 tokens) exceeds the available context
         size (2048 tokens), try increasing it","type":"exceed_context_size_error",
         "n_prompt_tokens":3528,"n_ctx":2048}}

Unlike the real server it refuses before waiting for a free slot (the real one counts once
a slot takes the request). An answer stops where the window ends, with ``"length"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from crossbar.testing.simulator.completions import token_limit
from crossbar.testing.simulator.replies import META, HttpError

Windows = int | Mapping[str, int] | None
"""A host's windows: one for every model, one per model (a model not named: none), or none."""
TINY_TRAINED = 2048
"""The training context of the integration tests' tiny models (:data:`META`'s)."""
UNKNOWN_WINDOW = 4096
"""What a model's ``/props`` says of its window when it has none: as before windows were kept."""


def window_of(windows: Windows, model: str) -> int | None:
    """The window of one slot of ``model``, or ``None`` (no limit)."""
    if windows is None or isinstance(windows, int):
        return windows
    return windows.get(model)


def check_prompt(tokens: int, window: int | None) -> None:
    """Refuse a prompt of ``tokens`` tokens that does not fit ``window``, as llama-server does."""
    if window is not None and tokens >= window:
        raise HttpError(
            400,
            f"request ({tokens} tokens) exceeds the available context size ({window} tokens),"
            " try increasing it",
            "exceed_context_size_error",
            {"n_prompt_tokens": tokens, "n_ctx": window},
        )


def within_window(chat: dict[str, Any], tokens: int, window: int | None) -> dict[str, Any]:
    """``chat`` with its token limit cut to what the window leaves after a prompt of
    ``tokens`` tokens (llama-server stops at ``n_past + 1 >= n_ctx``); refused
    (:func:`check_prompt`) when the prompt does not fit."""
    if window is None:
        return chat
    check_prompt(tokens, window)
    room = max(window - tokens - 1, 0)
    limit = token_limit(chat)
    if limit is not None and limit <= room:
        return chat
    return {**chat, "n_predict": room}


def meta(window: int | None, slots: int) -> dict[str, Any]:
    """A running model's ``meta`` in ``/v1/models``."""
    if window is None:
        return META
    whole = window * max(slots, 1)
    return {**META, "n_ctx": whole, "n_ctx_train": max(whole, TINY_TRAINED)}


def metas(windows: Windows, slots: int) -> Callable[[str], dict[str, Any]]:
    """Each model's ``meta``, for a host's windows and slots."""
    return lambda model: meta(window_of(windows, model), slots)


def props_window(window: int | None) -> int:
    """What ``/props`` says of a slot's window."""
    return UNKNOWN_WINDOW if window is None else window

"""The errors crossbar answers itself, in the shape the client's API reads.

On the API paths each error comes in the shape its clients parse for words: Anthropic's
``{"type": "error", "error": {"type", "message"}}`` on the Messages API (Claude Code and
the Anthropic SDK print its ``message``), and elsewhere the shape llama-server and OpenAI
answer, ``{"error": {"message", "type", "code"}}`` (the OpenAI SDKs print only
``error.message``: a plain string under ``error`` came out as ``Error code: 404``). The
words are the same in both. crossbar's own pages (``/_crossbar/``), which no API client
reads, keep the plain ``{"error": "<words>"}``. docs/clients.md shows what each client
prints. Pure rules, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

_ANTHROPIC = (b"/v1/messages", b"/v1/messages/count_tokens")
_RESPONSES = (b"/v1/responses", b"/v1/responses/input_tokens")
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "unavailable_error",
}
"""llama-server's own types (and its ``code``, the status): a client sees one shape
whether a host or crossbar answered. Others: ``invalid_request_error`` below 500,
``server_error`` from 500."""
_PAGES = b"/_crossbar/"


def error_payload(
    path: bytes, status: int, message: str, extra: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The JSON of crossbar's error ``message`` (``extra``: e.g. the host it is about, told
    in the words: ``upstream failed (host gpu-a)``) for a request to ``path`` (the whole
    path, or the route's part of it)."""
    if path.startswith(_PAGES) or path == _PAGES[:-1]:
        return {"error": message, **(extra or {})}
    words = message + "".join(f" ({name} {value})" for name, value in (extra or {}).items())
    if path.endswith(_ANTHROPIC):
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": words}}
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": words, "type": kind, "code": status}}


def too_long_payload(path: bytes, prompt_tokens: int, window: int) -> dict[str, object]:
    """The ``400`` body for a prompt of ``prompt_tokens`` tokens that fits no host (the
    largest window ``window``), in the words each API's clients act on: Anthropic's
    ``prompt is too long: N tokens > M maximum`` (Claude Code compacts on it), and OpenAI's
    ``context_length_exceeded`` code on chat, completions and Responses (Codex and the
    OpenAI SDKs read the code)."""
    if path.endswith(_ANTHROPIC):
        words = f"prompt is too long: {prompt_tokens} tokens > {window} maximum"
        return {"type": "error", "error": {"type": "invalid_request_error", "message": words}}
    if path.endswith(_RESPONSES):
        words = (
            f"Your input exceeds the context window of this model ({prompt_tokens} tokens >"
            f" {window} maximum). Please adjust your input and try again."
        )
    else:
        words = (
            f"This model's maximum context length is {window} tokens. However, your messages"
            f" resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
    error = {
        "message": words,
        "type": "invalid_request_error",
        "param": "input" if path.endswith(_RESPONSES) else "messages",
        "code": "context_length_exceeded",
    }
    return {"error": error}

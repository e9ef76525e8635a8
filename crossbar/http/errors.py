"""The errors crossbar answers itself, in the shape the client's API reads.

Most clients show ``{"error": "..."}`` as it is (the OpenAI SDKs, Codex, OpenCode: each
prints the text). Claude Code reads Anthropic's own shape on the Messages API and shows its
``message``: ``API Error: 503 no healthy host``, where the plain shape comes out as raw JSON.
(For a 404 and a 413 it shows words of its own whatever the body says; docs/clients.md
says what they mean.) Pure rules, no I/O.
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


def error_payload(
    path: bytes, status: int, message: str, extra: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The JSON of crossbar's error ``message`` (``extra``: e.g. the host it is about) for
    a request to ``path`` (the whole path, or the route's part of it)."""
    if not path.endswith(_ANTHROPIC):
        return {"error": message, **(extra or {})}
    words = message + "".join(f" ({name} {value})" for name, value in (extra or {}).items())
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": words}}


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

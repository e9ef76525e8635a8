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

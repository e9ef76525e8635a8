"""What crossbar's own error looks like on an API path other than Anthropic's: the shape
llama-server answers, which the OpenAI SDKs read the words of."""

from __future__ import annotations

TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "unavailable_error",
}


def api_error(status: int, words: str) -> dict[str, object]:
    """The body of crossbar's error ``words`` answered with ``status`` on an OpenAI path."""
    kind = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": words, "type": kind, "code": status}}

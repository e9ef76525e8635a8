"""crossbar.server.errors: crossbar's own errors in the shape the client's API reads."""

from __future__ import annotations

from crossbar.server.errors import error_payload


def test_the_openai_apis_and_the_rest_get_the_plain_shape() -> None:
    assert error_payload(b"/v1/chat/completions", 502, "upstream failed", {"host": "gpu-a"}) == {
        "error": "upstream failed",
        "host": "gpu-a",
    }
    assert error_payload(b"/lab/v1/responses", 401, "unauthorized") == {"error": "unauthorized"}


def test_the_messages_api_gets_anthropic_s_shape_with_the_same_words() -> None:
    """Claude Code shows ``error.message`` of this shape, and raw JSON of any other."""
    found = error_payload(b"/v1/messages", 502, "upstream failed", {"host": "gpu-a"})
    assert found == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream failed (host gpu-a)"},
    }
    assert error_payload(b"/lab/v1/messages/count_tokens", 503, "no healthy host") == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "no healthy host"},
    }
    assert error_payload(b"/lab/v1/messages", 401, "unauthorized")["error"] == {
        "type": "authentication_error",
        "message": "unauthorized",
    }

"""crossbar.proxy.shapes: the API paths crossbar forwards, and what it reads of each
body, in one decode. Pure rules over bytes."""

from __future__ import annotations

import json

import pytest

from crossbar.proxy.shapes import (
    CHAT,
    COMPLETION,
    SHAPES,
    model_in_path,
    not_found,
    read_body,
    read_conversation,
    shape_of,
)

MESSAGES = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "fix the parser"},
    {"role": "assistant", "content": "done"},
    {"role": "user", "content": "now the tests"},
]


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("rest", "forwarded"),
    [
        (b"/v1/chat/completions", True),
        (b"/v1/completions", True),
        (b"/v1/messages", True),
        (b"/v1/messages/count_tokens", True),
        (b"/v1/responses", True),
        (b"/v1/responses/input_tokens", True),
        (b"/v1/chat/completions/input_tokens", True),
        (b"/v1/embeddings", True),
        (b"/v1/models", True),
        (b"/health", True),
        (b"/props", True),
        (b"/v1/models/qwen3-4b", True),  # the SDKs' models.retrieve
        (b"/v1/models/org%2Fmodel", True),
        (b"/completion", True),  # llama-server's own stateless endpoints
        (b"/completions", True),
        (b"/infill", True),
        (b"/tokenize", True),
        (b"/detokenize", True),
        (b"/apply-template", True),
        (b"/embedding", True),
        (b"/embeddings", True),
        (b"/rerank", True),
        (b"/reranking", True),
        (b"/v1/rerank", True),
        (b"/v1/reranking", True),
        # llama-server's resumable stream sessions: never through a shared proxy
        (b"/v1/stream", False),
        (b"/v1/streams/lookup", False),
        (b"/v1", False),
        (b"/v1/", False),
        (b"/v1/anything-else", False),
        (b"/slots", False),
        (b"/slots/0", False),
        (b"/lora-adapters", False),
        (b"/v1/models/", False),
        (b"/metrics", False),
        (b"/health/x", False),
        (b"/models/load", False),
        (b"/", False),
    ],
)
def test_only_the_paths_in_the_table_are_forwarded(rest: bytes, forwarded: bool) -> None:
    assert (shape_of(rest) is not None) is forwarded


def test_the_model_and_the_stream_flag_are_read() -> None:
    facts = read_body(CHAT, body(model="qwen", stream=True, messages=MESSAGES), None, False)
    assert (facts.peek.model, facts.peek.missing, facts.stream) == ("qwen", False, True)
    assert facts.conversation is None  # not asked for: its fields are not even read


def test_a_body_without_a_model_says_so() -> None:
    facts = read_body(SHAPES[b"/v1/messages"], body(messages=MESSAGES), "dflt", False)
    assert facts.peek.model is None and facts.peek.missing and not facts.stream


def test_the_conversation_is_read_in_the_same_pass_when_asked() -> None:
    facts = read_body(CHAT, body(model="qwen", messages=MESSAGES), None, True)
    assert facts.peek.model == "qwen"
    assert facts.conversation is not None and facts.conversation.turn == 1
    # the key is the model the request is for: the route's default when the body has none
    mine = read_body(CHAT, body(messages=MESSAGES), "qwen", True).conversation
    assert mine == facts.conversation


def test_a_completion_has_a_conversation_and_no_turn() -> None:
    facts = read_body(COMPLETION, body(model="m", prompt="def main():"), None, True)
    assert facts.conversation is not None and facts.conversation.turn is None


def test_an_api_without_conversations_has_none_even_when_asked() -> None:
    facts = read_body(SHAPES[b"/v1/embeddings"], body(model="m", input="x"), None, True)
    assert facts.peek.model == "m" and facts.conversation is None


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1, 2]", b'{"model": "m"} trailing', b'{"model": 3, "messages": []}'],
)
def test_a_body_that_is_not_a_json_object_naming_a_model_has_no_model(raw: bytes) -> None:
    facts = read_body(CHAT, raw, "dflt", True)
    assert facts.peek.model is None and not facts.peek.missing and facts.conversation is None


def test_badly_shaped_messages_leave_the_model_readable() -> None:
    """The model decides the host: a conversation that cannot be read must not lose it."""
    facts = read_body(CHAT, body(model="qwen", messages="hi"), None, True)
    assert facts.peek.model == "qwen" and facts.conversation is None


def test_bodies_without_a_model_are_forwarded_as_they_are() -> None:
    form = SHAPES[b"/v1/audio/transcriptions"]
    facts = read_body(form, b"--boundary\r\nContent-Disposition: form-data", "dflt", True)
    assert facts.peek.model is None and not facts.peek.missing


def test_read_conversation_knows_only_the_paths_of_the_table() -> None:
    raw = body(model="m", messages=MESSAGES)
    assert read_conversation(b"/v1/chat/completions", raw, "m") is not None
    assert read_conversation(b"/v1/stream", raw, "m") is None


@pytest.mark.parametrize(
    ("path", "fields", "limit"),
    [
        (b"/v1/chat/completions", {"max_tokens": 512}, 512),
        (b"/v1/chat/completions", {"max_completion_tokens": 300, "max_tokens": 512}, 300),
        (b"/v1/completions", {"n_predict": 64, "max_tokens": 512}, 64),
        (b"/v1/messages", {"max_tokens": 32000}, 32000),
        (b"/v1/responses", {"max_output_tokens": 4096}, 4096),
        (b"/v1/chat/completions", {"max_tokens": -1}, None),  # no limit
        (b"/v1/chat/completions", {"max_tokens": "512"}, None),
        (b"/v1/chat/completions", {"max_tokens": 1e30}, None),
        (b"/v1/chat/completions", {}, None),
    ],
)
def test_the_answer_s_token_limit_is_read_in_the_same_pass(
    path: bytes, fields: dict[str, object], limit: int | None
) -> None:
    body = json.dumps({"model": "m", "messages": [], "input": "hi", **fields}).encode()
    for conversations in (False, True):
        assert read_body(SHAPES[path], body, None, conversations).reply_limit == limit


@pytest.mark.parametrize(
    ("rest", "words"),
    [
        (b"/chat/completions", "not found: did you mean /opencode/v1/chat/completions?"),
        (b"/v1/v1/messages", "not found: did you mean /opencode/v1/messages?"),
        (b"/models", "not found: did you mean /opencode/v1/models?"),
        (b"/v1/stream", "not found"),  # never forwarded, however spelled
        (b"/v1/v1/stream", "not found"),
        (b"/nothing", "not found"),
    ],
)
def test_a_wrong_path_names_the_route_s_right_one(rest: bytes, words: str) -> None:
    assert not_found("opencode", rest) == words


def test_a_model_entry_is_asked_of_a_host_by_the_model_in_its_path() -> None:
    assert model_in_path(b"/v1/models/qwen3-4b") == "qwen3-4b"
    assert model_in_path(b"/v1/models/org%2Fmodel") == "org/model"
    assert model_in_path(b"/v1/models/%ff") is None
    assert model_in_path(b"/v1/models") is None


def test_a_native_completion_is_placed_by_its_prompt_like_v1_completions() -> None:
    native = read_body(SHAPES[b"/completion"], body(model="m", prompt="def f():", n_predict=8),
                       None, conversations=True)  # fmt: skip
    api = read_body(COMPLETION, body(model="m", prompt="def f():"), None, conversations=True)
    assert native.peek.model == "m" and native.reply_limit == 8
    assert native.conversation == api.conversation is not None

"""crossbar.testing.simulator.messages: Anthropic's Messages API as llama-server speaks it:
the chat completion a request becomes, the forced tool, and the answer whole or as events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.messages import MessagesAnswer, forced_tool, to_chat
from crossbar.testing.simulator.replies import HttpError
from crossbar.testing.simulator.toolcalls import ToolCall

BASH = {
    "name": "Bash",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def reply(tokens: int = 2, limit: int | None = None) -> Reply:
    body = {} if limit is None else {"max_tokens": limit}
    return Reply.to(
        body, chat=True, model="m", created=1, chunks=tokens, pace=0.01, cache_n=3, prompt_n=7
    )


def sse(stream: Any) -> list[tuple[bool, list[tuple[str, dict[str, Any]]]]]:
    """Each write as (paced, its events as (name, data))."""
    out = []
    for paced, data in stream:
        events = []
        for block in data.decode().split("\n\n")[:-1]:
            name, payload = block.split("\n")
            assert name.startswith("event: ") and payload.startswith("data: ")
            events.append((name[7:], json.loads(payload[6:])))
        out.append((paced, events))
    return out


def test_a_request_becomes_a_chat_with_its_system_and_tool_turns() -> None:
    chat = to_chat(
        {
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "list files"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "running"},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "Bash",
                            "input": {"command": "ls"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
                    ],
                },
            ],
            "tools": [BASH],
            "temperature": 0,
            "stream": True,
            "metadata": {"user_id": "x"},
        }
    )
    assert chat == {
        "max_tokens": 4096,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": "running",
                "tool_calls": [{"id": "t1", "name": "Bash", "input": {"command": "ls"}}],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
        ],
        "tools": [BASH],
        "temperature": 0,
        "stream": True,
    }


def test_claude_codes_billing_nonce_is_rewritten_so_the_prompt_cache_reaches_past_it() -> None:
    system = "x-anthropic-billing-header: cc_version=2.1; cch=a1b2c;\nYou are Claude Code."
    chat = to_chat({"system": system, "messages": []})
    assert chat["messages"][0]["content"] == (
        "x-anthropic-billing-header: cc_version=2.1; cch=fffff;\nYou are Claude Code."
    )


def test_a_request_without_messages_is_refused_as_llama_server_does() -> None:
    with pytest.raises(HttpError) as refused:
        to_chat({"model": "m"})
    assert (refused.value.status, refused.value.message) == (500, "'messages' is required")


def test_tool_choice_forces_the_named_tool_or_any() -> None:
    tools = [{"name": "Read", "input_schema": {}}, BASH]
    named = forced_tool({"tools": tools, "tool_choice": {"type": "tool", "name": "Bash"}})
    assert named is not None and named.name == "Bash"
    first = forced_tool({"tools": tools, "tool_choice": {"type": "any"}})
    assert first is not None and first.name == "Read"
    assert forced_tool({"tools": tools, "tool_choice": {"type": "auto"}}) is None
    assert forced_tool({"tools": tools}) is None


def test_the_whole_answer_reports_input_without_the_cached_tokens() -> None:
    whole = MessagesAnswer(reply(2), 3, None).whole()
    assert whole["content"] == [{"type": "text", "text": "abcdef"}]
    assert whole["stop_reason"] == "end_turn"
    assert whole["usage"] == {"cache_read_input_tokens": 3, "input_tokens": 7, "output_tokens": 2}
    cut = MessagesAnswer(reply(5, limit=2), 3, None).whole()
    assert cut["stop_reason"] == "max_tokens"


def test_a_forced_call_answers_with_tool_use_and_its_input() -> None:
    call = ToolCall("Bash", '{"command":"ls"}')
    whole = MessagesAnswer(reply(), 4, call).whole()
    assert whole["stop_reason"] == "tool_use"
    assert whole["content"] == [
        {"type": "tool_use", "id": call.id, "name": "Bash", "input": {"command": "ls"}}
    ]


def test_the_stream_opens_with_the_first_token_and_ends_in_one_write() -> None:
    writes = sse(MessagesAnswer(reply(2), 2, None).events())

    assert [paced for paced, _ in writes] == [True, True, False]
    assert [name for name, _ in writes[0][1]] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
    ]
    assert writes[0][1][0][1]["message"]["usage"]["output_tokens"] == 0
    assert [data["delta"]["text"] for _, data in (writes[0][1][-1], writes[1][1][0])] == [
        "ab",
        "cd",
    ]
    names = [name for name, _ in writes[2][1]]
    assert names == ["content_block_stop", "message_delta", "message_stop"]
    assert writes[2][1][1][1]["usage"] == {"output_tokens": 2}


def test_an_answer_of_no_token_starts_and_ends_in_one_write() -> None:
    (only,) = sse(MessagesAnswer(reply(5, limit=0), 2, None).events())
    assert only[0] is False
    assert [name for name, _ in only[1]] == ["message_start", "message_delta", "message_stop"]


def test_a_streamed_call_sends_its_arguments_as_json_deltas() -> None:
    call = ToolCall("Bash", '{"command":"ls"}')
    writes = sse(MessagesAnswer(reply(), 8, call).events())
    deltas = [d["delta"] for _, events in writes for n, d in events if n == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"input_json_delta"}
    assert "".join(d["partial_json"] for d in deltas) == call.arguments

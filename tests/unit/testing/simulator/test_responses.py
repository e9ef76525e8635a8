"""crossbar.testing.simulator.responses: OpenAI's Responses API as llama-server speaks it
(what Codex sends): the chat a request becomes, its refusals, and the answer whole or as
events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.replies import HttpError
from crossbar.testing.simulator.responses import ResponsesAnswer, forced_tool, to_chat
from crossbar.testing.simulator.toolcalls import ToolCall

SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array"}},
        "required": ["command"],
    },
}


def reply(tokens: int = 2) -> Reply:
    return Reply.to(
        {}, chat=True, model="m", created=7, chunks=tokens, pace=0.01, cache_n=3, prompt_n=7
    )


def sse(stream: Any) -> list[tuple[bool, list[dict[str, Any]]]]:
    out = []
    for paced, data in stream:
        events = []
        for block in data.decode().split("\n\n")[:-1]:
            name, payload = block.split("\n")
            event = json.loads(payload.removeprefix("data: "))
            assert name == "event: " + event["type"]
            events.append(event)
        out.append((paced, events))
    return out


def test_a_request_becomes_a_chat_of_its_instructions_and_items() -> None:
    chat = to_chat(
        {
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                {
                    "type": "function_call",
                    "name": "shell",
                    "arguments": '{"command":["ls"]}',
                    "call_id": "c1",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            ],
            "tools": [SHELL, {"type": "web_search"}],
            "max_output_tokens": 64,
            "stream": True,
        }
    )
    assert chat == {
        "model": "m",
        "stream": True,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "shell", "arguments": '{"command":["ls"]}'}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ],
        "tools": [SHELL],
        "max_tokens": 64,
    }
    assert to_chat({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'input' is required"),
        (
            {"input": "hi", "previous_response_id": "resp_1"},
            "llama.cpp does not support 'previous_response_id'.",
        ),
        ({"input": 3}, "'input' must be a string or array of objects"),
        ({"input": [{"type": "image"}]}, "Cannot determine type of 'item'"),
        ({"input": "hi", "tools": {}}, "'tools' must be an array of objects"),
    ],
)
def test_a_request_llama_server_cannot_read_is_refused_in_its_words(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(HttpError) as refused:
        to_chat(body)
    assert (refused.value.status, refused.value.message) == (400, message)


def test_tool_choice_forces_a_function_by_name_or_required() -> None:
    tools = [{"type": "web_search"}, SHELL]
    named = forced_tool({"tools": tools, "tool_choice": {"type": "function", "name": "shell"}})
    assert named is not None and json.loads(named.arguments) == {"command": []}
    assert forced_tool({"tools": tools, "tool_choice": "required"}).name == "shell"  # type: ignore[union-attr]
    assert forced_tool({"tools": tools, "tool_choice": "auto"}) is None


def test_the_whole_answer_has_its_message_and_usage() -> None:
    answer = ResponsesAnswer(reply(2), 3, None)
    whole = answer.whole()
    assert whole["object"] == "response" and whole["status"] == "completed"
    assert whole["id"].startswith("resp_")
    (message,) = whole["output"]
    assert message["content"][0]["text"] == "abcdef"
    assert message["id"] == answer.message_id
    assert whole["usage"] == {
        "input_tokens": 10,
        "output_tokens": 2,
        "total_tokens": 12,
        "input_tokens_details": {"cached_tokens": 3},
    }
    assert ResponsesAnswer(reply(0), 3, None).whole()["output"] == []


def test_a_forced_call_is_a_function_call_item() -> None:
    call = ToolCall("shell", '{"command":["ls"]}')
    (item,) = ResponsesAnswer(reply(), 4, call).whole()["output"]
    assert item == {
        "id": "fc_" + call.id,
        "type": "function_call",
        "status": "completed",
        "arguments": call.arguments,
        "call_id": "call_" + call.id,
        "name": "shell",
    }


def test_the_stream_opens_with_the_first_token_and_completes_in_one_write() -> None:
    writes = sse(ResponsesAnswer(reply(2), 2, None).events())

    assert [paced for paced, _ in writes] == [True, True, False]
    assert [e["type"] for e in writes[0][1]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert [e["type"] for e in writes[2][1]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert writes[2][1][0]["text"] == "abcd"
    assert writes[2][1][-1]["response"]["usage"]["output_tokens"] == 2


def test_a_streamed_call_sends_its_arguments_as_deltas() -> None:
    call = ToolCall("shell", '{"command":["ls"]}')
    writes = sse(ResponsesAnswer(reply(), 5, call).events())
    deltas = [e for _, events in writes for e in events if e["type"].endswith(".delta")]
    assert {e["type"] for e in deltas} == {"response.function_call_arguments.delta"}
    assert "".join(e["delta"] for e in deltas) == call.arguments
    assert writes[-1][1][-1]["response"]["output"][0]["name"] == "shell"

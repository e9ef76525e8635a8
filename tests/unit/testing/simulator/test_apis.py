"""crossbar.testing.simulator.apis: which paths generate or count tokens, in which API, and
how each API's request and answer map onto one chat completion."""

from __future__ import annotations

import json

from crossbar.testing.simulator.apis import COUNT, GENERATE, counted, prompt, shape, to_chat
from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.messages import MessagesAnswer
from crossbar.testing.simulator.responses import ResponsesAnswer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
MESSAGES = {
    "model": "m",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hello there"}],
}
RESPONSES = {"model": "m", "input": "hello there"}


def reply(chat: bool = True) -> Reply:
    return Reply.to({}, chat=chat, model="m", created=1, chunks=2, pace=0.01)


def test_each_generating_path_has_its_api() -> None:
    assert GENERATE["/v1/chat/completions"] == "chat"
    assert GENERATE["/v1/completions"] == "text"
    assert GENERATE["/v1/messages"] == "messages"
    assert GENERATE["/v1/responses"] == "responses"
    assert COUNT["/v1/messages/count_tokens"] == "messages"
    assert COUNT["/v1/responses/input_tokens"] == "responses"
    assert not set(GENERATE) & set(COUNT)


def test_the_agent_apis_become_a_chat_and_the_openai_ones_stay_as_they_are() -> None:
    assert to_chat("chat", CHAT) == CHAT
    assert to_chat("messages", MESSAGES)["messages"] == CHAT["messages"]
    assert to_chat("responses", RESPONSES)["messages"] == CHAT["messages"]


def test_the_same_conversation_is_the_same_prompt_in_every_chat_api() -> None:
    tokens = prompt("chat", CHAT)
    assert tokens
    assert prompt("messages", MESSAGES) == tokens
    assert prompt("responses", RESPONSES) == tokens
    assert prompt("text", {"prompt": "hello there"}) != tokens  # no chat template


def test_a_count_answers_input_tokens_with_an_object_on_openais_paths() -> None:
    n = len(prompt("chat", CHAT))
    assert counted("messages", MESSAGES) == {"input_tokens": n}
    assert counted("responses", RESPONSES) == {"input_tokens": n, "object": "response.input_tokens"}
    assert counted("chat", CHAT) == {"input_tokens": n, "object": "response.input_tokens"}


def test_an_answer_takes_its_apis_shape() -> None:
    assert isinstance(shape("messages", MESSAGES, reply(), 3), MessagesAnswer)
    assert isinstance(shape("responses", RESPONSES, reply(), 3), ResponsesAnswer)
    chat = shape("chat", CHAT, reply(), 3)
    assert chat.tokens == 2
    assert chat.whole()["choices"][0]["message"]["content"] == "abcdef"
    assert chat.kept(4) == "abcd"


def test_a_chat_stream_carries_usage_only_when_include_usage_asks() -> None:
    def last_data(body: dict[str, object]) -> dict[str, object]:
        *_, last, done = shape("chat", body, reply(), 1).events()
        assert done[1] == b"data: [DONE]\n\n"
        return json.loads(last[1][6:])  # type: ignore[no-any-return]

    assert "usage" not in last_data(CHAT)
    assert "usage" in last_data({**CHAT, "stream_options": {"include_usage": True}})
    assert "usage" not in last_data({**CHAT, "stream_options": {"include_usage": "yes"}})


# -- a file an agent asks for, in each API ------------------------------------------------------

ASK = "create hello.py that prints hello"
SCHEMA = {
    "type": "object",
    "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
    "required": ["filePath", "content"],
}
ARGUMENTS = {"filePath": "/p/hello.py", "content": 'print("hello")\n'}
CHAT_ASKING = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Working directory: /p"},
        {"role": "user", "content": ASK},
    ],
    "tools": [{"type": "function", "function": {"name": "write", "parameters": SCHEMA}}],
}
MESSAGES_ASKING = {
    "model": "m",
    "system": "Working directory: /p",
    "messages": [{"role": "user", "content": [{"type": "text", "text": ASK}]}],
    "tools": [{"name": "write", "input_schema": SCHEMA}],
}
RESPONSES_ASKING = {
    "model": "m",
    "instructions": "Working directory: /p",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}
    ],
    "tools": [{"type": "function", "name": "write", "parameters": SCHEMA}],
}


def data(events: list[tuple[bool, bytes]]) -> list[dict[str, object]]:
    """Every ``data:`` JSON of a stream's events (``[DONE]`` left out)."""
    lines = [line for _, chunk in events for line in chunk.decode().splitlines()]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_a_chat_asking_for_a_file_is_answered_with_tool_calls() -> None:
    answer = shape("chat", CHAT_ASKING, reply(), 4)
    (choice,) = answer.whole()["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert (call["type"], call["function"]["name"]) == ("function", "write")
    assert json.loads(call["function"]["arguments"]) == ARGUMENTS
    assert len(call["id"]) == 32 and call["id"].isalnum()
    assert answer.whole()["usage"]["completion_tokens"] == answer.tokens > 2

    chunks = data(list(answer.events()))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]  # type: ignore[index]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert len(calls) == answer.tokens
    assert {k: calls[0][k] for k in ("index", "id", "type")} == {
        "index": 0,
        "id": call["id"],
        "type": "function",
    }
    assert calls[0]["function"]["name"] == "write" and "name" not in calls[1]["function"]
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == ARGUMENTS
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]


def test_a_chat_ends_its_turn_in_words_after_the_tools_result() -> None:
    messages = CHAT_ASKING["messages"] + [  # type: ignore[operator]
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
        {"role": "tool", "tool_call_id": "x", "content": "Wrote file successfully."},
    ]
    answer = shape("chat", {**CHAT_ASKING, "messages": messages, "stream": True}, reply(), 4)
    (choice,) = answer.whole()["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Created hello.py."}
    assert choice["finish_reason"] == "stop"
    chunks = data(list(answer.events()))
    said = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]  # type: ignore[index]
    assert "".join(said) == "Created hello.py."


def test_a_chat_without_a_file_asked_or_with_tools_refused_says_the_alphabet() -> None:
    hi = {**CHAT_ASKING, "messages": [{"role": "user", "content": "say hi"}]}
    refused = {**CHAT_ASKING, "tool_choice": "none"}
    for body in (hi, refused, CHAT):
        message = shape("chat", body, reply(), 3).whole()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": "abcdef"}


def test_a_chat_forced_tool_is_called() -> None:
    forced = {**CHAT, "tools": CHAT_ASKING["tools"], "tool_choice": "required"}
    (call,) = shape("chat", forced, reply(), 3).whole()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "write"
    named = {**forced, "tool_choice": {"type": "function", "function": {"name": "write"}}}
    assert shape("chat", named, reply(), 3).whole()["choices"][0]["finish_reason"] == "tool_calls"


def test_messages_asking_for_a_file_get_a_tool_use_then_end_the_turn() -> None:
    answer = shape("messages", MESSAGES_ASKING, reply(), 4).whole()
    (block,) = answer["content"]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "write", ARGUMENTS)
    assert answer["stop_reason"] == "tool_use"
    result = {"type": "tool_result", "tool_use_id": block["id"], "content": "ok"}
    turn = [
        *MESSAGES_ASKING["messages"],  # type: ignore[misc]
        {"role": "assistant", "content": [block]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}, result],
        },
    ]
    done = shape("messages", {**MESSAGES_ASKING, "messages": turn}, reply(), 4).whole()
    assert done["content"] == [{"type": "text", "text": "Created hello.py."}]
    assert done["stop_reason"] == "end_turn"
    assert done["usage"]["output_tokens"] == 5


def test_responses_asking_for_a_file_get_a_function_call_then_a_message() -> None:
    answer = shape("responses", RESPONSES_ASKING, reply(), 4).whole()
    (item,) = answer["output"]
    assert (item["type"], item["name"]) == ("function_call", "write")
    assert json.loads(item["arguments"]) == ARGUMENTS
    output = {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}
    turn = [*RESPONSES_ASKING["input"], item, output]  # type: ignore[misc]
    done = shape("responses", {**RESPONSES_ASKING, "input": turn}, reply(), 4).whole()
    (message,) = done["output"]
    assert message["content"][0]["text"] == "Created hello.py."
    assert done["usage"]["output_tokens"] == 5

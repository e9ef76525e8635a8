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

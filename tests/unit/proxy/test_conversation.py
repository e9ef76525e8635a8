"""crossbar.proxy.conversation: the key of the conversation a request continues. Pure
rules, called directly; real clients' bodies (the OpenAI Python SDK's, OpenCode-like ones)
across the turns of a conversation."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossbar.proxy.conversation import PROMPT_BYTES
from crossbar.proxy.shapes import read_conversation
from crossbar.routing.policies import Conversation
from tests.support.codex_requests import opening

CHAT = b"/v1/chat/completions"
COMPLETIONS = b"/v1/completions"
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}


def read(
    body: bytes | dict[str, Any], path: bytes = CHAT, model: str | None = "m"
) -> Conversation | None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return read_conversation(path, data, model)


def key(body: bytes | dict[str, Any], path: bytes = CHAT, model: str | None = "m") -> bytes | None:
    found = read(body, path, model)
    return None if found is None else found.key


def turns(first: str, count: int) -> list[list[dict[str, Any]]]:
    """The messages an agent sends at turns 1..count: the history grows every turn."""
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": first}]
    sent = [list(messages)]
    for turn in range(2, count + 1):
        messages.append({"role": "assistant", "content": f"answer {turn - 1}"})
        messages.append({"role": "user", "content": f"and now step {turn}"})
        sent.append(list(messages))
    return sent


def test_every_turn_of_a_conversation_has_the_same_key() -> None:
    keys = {key({"model": "m", "messages": m, "stream": True}) for m in turns("fix main.py", 8)}
    assert len(keys) == 1
    assert None not in keys


def test_another_first_user_message_is_another_conversation() -> None:
    """One agent's conversations share the system prompt, not the first user message."""
    one = key({"messages": turns("fix main.py", 1)[0]})
    other = key({"messages": turns("fix util.py", 1)[0]})
    assert one is not None and other is not None and one != other


def test_the_system_prompt_and_the_model_count_too() -> None:
    messages = turns("fix main.py", 1)[0]
    changed = [{"role": "system", "content": "Another agent."}, messages[1]]
    assert key({"messages": messages}) != key({"messages": changed})
    assert key({"messages": messages}, model="m") != key({"messages": messages}, model="n")
    assert key({"messages": messages}, model=None) is not None


def test_the_key_is_the_same_in_every_process_and_version() -> None:
    """A digest, not Python's salted hash(): replicas must agree, a replica of the next
    version too (changing this value moves every conversation once, in a rollout)."""
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert key(body, model="m") == bytes.fromhex("7b7ca77ea85769e8de962909a2ed82a1")


def test_the_openai_sdk_keeps_its_key_across_turns() -> None:
    """The SDK's real serialisation: turn 2 resends the reply as the SDK's own message
    object (written back with its keys in another order)."""
    bodies: list[bytes] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        bodies.append(request.content)
        message = {"role": "assistant", "content": f"d\u00e9j\u00e0 fait {len(bodies)}"}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        doc = {"id": "x", "object": "chat.completion", "created": 0, "model": "m"}
        return httpx2.Response(200, json={**doc, "choices": [choice]})

    transport = httpx2.MockTransport(answer)
    client = openai.OpenAI(
        base_url="http://crossbar.test/lab/v1",
        api_key="unused",
        http_client=httpx2.Client(transport=transport),
    )
    messages: list[Any] = [
        {"role": "system", "content": "Be brief. Caf\u00e9 rules apply."},
        {"role": "user", "content": "r\u00e9sume main.py"},
    ]
    for turn in range(3):
        reply = client.chat.completions.create(model="m", messages=messages)
        messages += [reply.choices[0].message, {"role": "user", "content": f"more {turn}"}]
    assert len(bodies) == 3 and bodies[0] != bodies[1]
    assert len({key(body) for body in bodies}) == 1
    other = [messages[0], {"role": "user", "content": "something else"}]
    client.chat.completions.create(model="m", messages=other)
    assert key(bodies[-1]) != key(bodies[0])


def opencode_body(turn: int, first: str = "add a test") -> dict[str, Any]:
    """Shaped like OpenCode's (the AI SDK's openai-compatible provider): user content as
    parts, tools, usage asked for; the newest message carries a provider's cache marker,
    so at turn 1 the first user message has one and at turn 2 it does not."""
    marker = {"cache_control": {"type": "ephemeral"}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are opencode, an interactive CLI tool."},
        {"role": "user", "content": [{"type": "text", "text": first}]},
    ]
    for step in range(1, turn):
        call = {
            "id": f"c{step}",
            "type": "function",
            "function": {"name": "read", "arguments": "{}"},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": "file text"})
    messages[-1] = {**messages[-1], **marker}
    tools = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    return {
        "model": "qwen3-coder-30b",
        "messages": messages,
        "tools": tools,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_opencode_like_bodies_keep_their_key_across_turns() -> None:
    keys = {key(opencode_body(turn)) for turn in range(1, 9)}
    assert len(keys) == 1 and None not in keys
    assert key(opencode_body(3, first="fix the build")) not in keys


def test_writing_the_same_messages_differently_keeps_the_key() -> None:
    """Key order, whitespace, escapes and extra fields: the same role and content."""
    body = {"messages": [SYSTEM, {"role": "user", "content": "caf\u00e9 \u2713"}]}
    compact = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    spaced = json.dumps(body, indent=2).encode()  # \u escapes, newlines
    reordered = json.dumps(
        {
            "messages": [
                {"content": m["content"], "name": "x", "role": m["role"]} for m in body["messages"]
            ]
        }
    ).encode()
    assert key(compact) == key(spaced) == key(reordered) == key(b"\xef\xbb\xbf" + compact)


def test_a_cache_marker_on_a_text_part_keeps_the_key() -> None:
    """Some clients mark the newest text part (not the message) for a provider's cache."""
    part = {"type": "text", "text": "fix main.py"}
    marked = {**part, "cache_control": {"type": "ephemeral"}}
    turn_1 = {"messages": [SYSTEM, {"role": "user", "content": [marked]}]}
    turn_2 = {"messages": [SYSTEM, {"role": "user", "content": [part]}, {"role": "assistant"}]}
    assert key(turn_1) == key(turn_2)


def test_content_as_text_parts_keeps_other_parts() -> None:
    text = {"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}]}]}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with_image = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]
    }
    other_image = json.loads(json.dumps(with_image).replace("AAAA", "BBBB"))
    assert len({key(text), key(with_image), key(other_image)}) == 3


def test_a_completion_is_known_by_the_start_of_its_prompt() -> None:
    start = "x" * PROMPT_BYTES
    one = key({"prompt": start + "turn one"}, COMPLETIONS)
    two = key({"prompt": start + "turn two, longer"}, COMPLETIONS)
    assert one is not None and one == two
    assert key({"prompt": "y" + start}, COMPLETIONS) != one
    tokens = key(b'{"prompt": [1, 2, 3]}', COMPLETIONS)
    assert tokens is not None and tokens == key(b'{"prompt":[1,2,3]}', COMPLETIONS)
    assert tokens != key(b'{"prompt":[1,2,4]}', COMPLETIONS)
    assert key({"prompt": "hi"}, COMPLETIONS) != key(
        {"messages": [{"role": "user", "content": "hi"}]}
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (b"/v1/embeddings", b'{"messages": [{"role": "user", "content": "hi"}]}'),
        (b"/v1/models", b""),
        (CHAT, b""),
        (CHAT, b"not json"),
        (CHAT, b"[1, 2]"),
        (CHAT, b'{"model": "m"}'),
        (CHAT, b'{"messages": []}'),
        (CHAT, b'{"messages": "hi"}'),
        (CHAT, b'{"messages": [{"role": "system", "content": "only a system prompt"}]}'),
        (CHAT, b'{"messages": [1, {"role": "user", "content": "hi"}]}'),
        (CHAT, b'{"messages": [{"role": 3, "content": "hi"}]}'),
        (CHAT, b'{"messages": [{"role": "user", "content": "hi"}]} trailing'),
        (CHAT, b'{"messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}"),
        (COMPLETIONS, b'{"messages": [{"role": "user", "content": "hi"}]}'),
        (COMPLETIONS, b'{"prompt": "\\ud800 unpaired'),
    ],
)
def test_a_request_without_a_conversation_has_no_key(path: bytes, body: bytes) -> None:
    assert read(body, path) is None


@given(st.binary(max_size=2000), st.sampled_from([CHAT, COMPLETIONS]))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_bytes_give_a_key_or_none_never_an_error(body: bytes, path: bytes) -> None:
    found = key(body, path)
    assert found is None or len(found) == 16


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@given(st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), _json), max_size=5))
@settings(max_examples=150, deadline=None)
def test_any_json_messages_give_a_key_or_none_never_an_error(messages: list[Any]) -> None:
    found = key({"messages": messages})
    assert found is None or len(found) == 16


def test_the_turn_counts_the_answers_the_client_sent_back() -> None:
    """A replica that sees turn 3 after turn 1 knows another one answered turn 2."""
    history = turns("fix the parser", 4)
    found = [read({"messages": messages}) for messages in history]
    assert [None if f is None else f.turn for f in found] == [0, 1, 2, 3]
    tools = [
        *history[1],
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function"}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
    ]
    with_tools = read({"messages": tools})
    assert (
        with_tools is not None
        and with_tools.turn == 2
        and with_tools.key == key({"messages": history[0]})
    )


def test_a_completion_has_no_turn() -> None:
    found = read({"prompt": "def main():"}, COMPLETIONS)
    assert found is not None and found.turn is None


# -- the budget: a body is anyone's, and the key is made on the reactor ------------------------


def test_a_start_past_the_budget_has_no_conversation() -> None:
    from crossbar.proxy import conversation as c

    user = {"role": "user", "content": "hi"}
    system = {"role": "system", "content": "s"}
    assert key({"messages": [system] * (c.MAX_START - 1) + [user]}) is not None
    assert key({"messages": [system] * c.MAX_START + [user]}) is None
    long = {"role": "system", "content": "x" * c.MAX_CONTENT}  # its JSON: 2 bytes more
    assert key({"messages": [long, user]}) is None
    fits = {"role": "system", "content": "x" * (c.MAX_CONTENT - 2)}
    assert key({"messages": [fits, user]}) is not None
    parts = [{"type": "text", "text": "p"}]
    assert key({"messages": [{"role": "system", "content": parts * c.MAX_PARTS}, user]})
    assert (
        key({"messages": [{"role": "system", "content": parts * (c.MAX_PARTS + 1)}, user]}) is None
    )


def test_a_flood_of_objects_in_the_messages_is_no_conversation_whatever_follows() -> None:
    from crossbar.proxy import conversation as c

    flood = b'{"messages":[' + b"{}," * (c.MAX_OBJECTS + 1) + b'{"role":"user","content":"hi"}]}'
    assert key(flood) is None
    # the count is of objects, not of bytes: a long conversation of few messages is read
    answer = {"role": "assistant", "content": "y" * (2 * c.MAX_OBJECTS)}
    assert key({"messages": [{"role": "user", "content": "hi"}, answer]}) is not None


# -- Claude Code (Anthropic Messages) and Codex (Responses) ------------------------------------

MESSAGES_PATH = b"/v1/messages"
RESPONSES_PATH = b"/v1/responses"
CLAUDE_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."


def claude_body(turn: int, nonce: str | None = "a5145", first: str = "fix the parser") -> bytes:
    """Turn ``turn`` (1, 2, ...) of a Claude Code session, as it sends it: a billing block
    first in ``system`` (with a nonce per request in some versions), cache markers on the
    newest message only, tool use and results in between."""
    billing = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli;"
    if nonce is not None:
        billing += f" cch={nonce};"
    system = [
        {"type": "text", "text": billing},
        {"type": "text", "text": CLAUDE_SYSTEM, "cache_control": {"type": "ephemeral"}},
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": first}]},
    ]
    for n in range(1, turn):
        use = {"type": "tool_use", "id": f"t{n}", "name": "Read", "input": {"path": "a.py"}}
        messages.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "text"}
        messages.append({"role": "user", "content": [result]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {"model": "tiny-a", "system": system, "messages": messages, "max_tokens": 32}
    return json.dumps(body).encode()


def codex_body(turn: int, first: str = "fix the parser") -> bytes:
    """Turn ``turn`` of a Codex session: what Codex sends before the prompt (developer
    messages, its context as a user item), the prompt, then each answer as reasoning and a
    function call, and the call's output."""
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": first}]}
    items: list[dict[str, Any]] = [*opening(), user]
    for n in range(1, turn):
        items.append({"type": "reasoning", "summary": [], "encrypted_content": f"r{n}"})
        call = {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": f"c{n}"}
        items.append(call)
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": "ok"})
    body = {"model": "tiny-a", "instructions": "You are Codex.", "input": items, "stream": True}
    return json.dumps(body).encode()


def test_every_turn_of_a_claude_code_session_has_one_key_whatever_its_nonce() -> None:
    found = [read(claude_body(turn, nonce=f"{turn:05x}"), MESSAGES_PATH) for turn in (1, 2, 3, 4)]
    assert all(f is not None for f in found)
    assert len({f.key for f in found if f}) == 1
    assert [f.turn for f in found if f] == [0, 1, 2, 3]
    # the same session in a version without the nonce, and with the header in one string
    without = read(claude_body(2, nonce=None), MESSAGES_PATH)
    assert without is not None and without.key == found[0].key  # type: ignore[union-attr]
    other = read(claude_body(1, first="write the docs"), MESSAGES_PATH)
    assert other is not None and other.key != found[0].key  # type: ignore[union-attr]


def test_a_billing_header_inside_a_system_string_is_left_out_too() -> None:
    def string_system(nonce: str) -> bytes:
        system = f"x-anthropic-billing-header: cc_version=2.1.9; cch={nonce};{CLAUDE_SYSTEM}"
        messages = [{"role": "user", "content": "hi"}]
        return json.dumps({"model": "m", "system": system, "messages": messages}).encode()

    one, two = (read(string_system(n), MESSAGES_PATH) for n in ("aaaaa", "bbbbb"))
    assert one is not None and two is not None and one.key == two.key
    other = json.dumps(
        {"model": "m", "system": "Another agent.", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert key(other.encode(), MESSAGES_PATH) != one.key


def test_every_turn_of_a_codex_session_has_one_key_and_counts_its_answers() -> None:
    found = [read(codex_body(turn), RESPONSES_PATH) for turn in (1, 2, 3, 4)]
    assert all(f is not None for f in found)
    assert len({f.key for f in found if f}) == 1
    assert [f.turn for f in found if f] == [0, 1, 2, 3]  # reasoning and a call: one answer each
    assert key(codex_body(1, first="write the docs"), RESPONSES_PATH) != found[0].key  # type: ignore[union-attr]


def test_a_responses_input_given_as_a_string_is_its_first_user_message() -> None:
    plain = json.dumps({"model": "m", "instructions": "Be brief.", "input": "say hi"}).encode()
    found = read(plain, RESPONSES_PATH)
    assert found is not None and found.turn == 0
    again = json.dumps({"model": "m", "instructions": "Be brief.", "input": "say hi"}, indent=1)
    assert key(again.encode(), RESPONSES_PATH) == found.key
    assert key(plain.replace(b"say hi", b"say bye"), RESPONSES_PATH) != found.key


def test_the_apis_never_share_a_key() -> None:
    """The same words through chat and through Messages are two prompts on a host."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert key(chat) != key(json.dumps(chat).encode(), MESSAGES_PATH)


# -- the prefix new conversations share ----------------------------------------------------


def prefix(body: dict[str, Any], path: bytes = CHAT) -> bytes | None:
    found = read(body, path)
    return None if found is None else found.prefix


TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


def test_new_chats_of_one_agent_share_a_prefix_but_not_a_key() -> None:
    one = {"messages": [SYSTEM, {"role": "user", "content": "fix the tests"}], "tools": TOOLS}
    two = {"messages": [SYSTEM, {"role": "user", "content": "write the docs"}], "tools": TOOLS}
    assert key(one) != key(two)
    assert prefix(one) == prefix(two) is not None
    later = {**one, "messages": [*one["messages"], {"role": "assistant", "content": "ok"}]}
    assert prefix(later) == prefix(one)


def test_other_tools_or_another_system_prompt_are_another_prefix() -> None:
    one = {"messages": [SYSTEM, {"role": "user", "content": "go"}], "tools": TOOLS}
    fewer = {**one, "tools": TOOLS[:0]}
    other = {**one, "messages": [{"role": "system", "content": "short"}, one["messages"][1]]}
    assert len({prefix(one), prefix(fewer), prefix(other)}) == 3


def test_claude_codes_billing_nonce_changes_no_prefix() -> None:
    def body(nonce: str, first: str) -> dict[str, Any]:
        system = f"x-anthropic-billing-header: cc_version=2.1; cch={nonce};You are Claude Code."
        return {"system": system, "messages": [{"role": "user", "content": first}], "tools": TOOLS}

    assert (
        prefix(body("a1", "fix"), MESSAGES_PATH)
        == prefix(body("b2", "docs"), MESSAGES_PATH)
        is not None
    )


def test_responses_share_a_prefix_through_their_instructions() -> None:
    one = {"instructions": "You are Codex.", "input": "say hi", "tools": TOOLS}
    two = {"instructions": "You are Codex.", "input": "say bye", "tools": TOOLS}
    assert key(one, RESPONSES_PATH) != key(two, RESPONSES_PATH)
    assert prefix(one, RESPONSES_PATH) == prefix(two, RESPONSES_PATH) is not None

"""The conversations of Codex's own requests: what Codex 0.169.0 really sent
(:mod:`tests.support.codex_requests` says how it was recorded), read as ``cache_affinity`` reads it.

Codex sends its context (the AGENTS.md, the working directory, shell and date) as a user
item before the person's prompt, the same in every session started in one directory: the
key must read on to the prompt, or all of those sessions are one conversation on one host.
"""

from __future__ import annotations

import json
from typing import Any

from crossbar.proxy.shapes import read_conversation
from crossbar.routing.policies import Conversation
from tests.support.codex_requests import codex_turn_body, opening, recorded

RESPONSES = b"/v1/responses"


def read(body: dict[str, Any]) -> Conversation:
    found = read_conversation(RESPONSES, json.dumps(body).encode(), None)
    assert found is not None, body
    return found


def test_two_codex_sessions_started_in_one_directory_are_two_conversations() -> None:
    fix, readme = (r for r in recorded() if r["turn"] == 0 and r["session"] != "elsewhere")
    # everything before the prompt is the same but for the items' ids
    assert [item["role"] for item in fix["body"]["input"]] == [
        "developer",
        "developer",
        "user",
        "user",
    ]
    for one, other in zip(fix["body"]["input"][:3], readme["body"]["input"][:3], strict=True):
        assert one["content"] == other["content"]
    assert read(fix["body"]).key != read(readme["body"]).key


def test_every_recorded_codex_request_has_its_session_s_key_and_turn() -> None:
    """Seven requests of three sessions (one resumed, a later user prompt): three keys, and
    each request's turn is the number of answers it sends back."""
    requests = recorded()
    found = [read(r["body"]) for r in requests]
    keys: dict[str, set[bytes]] = {}
    for request, conversation in zip(requests, found, strict=True):
        keys.setdefault(request["session"], set()).add(conversation.key)
    assert {session: len(seen) for session, seen in keys.items()} == {
        "fix": 1,
        "readme": 1,
        "elsewhere": 1,
    }
    assert len(set().union(*keys.values())) == 3
    assert [c.turn for c in found] == [r["turn"] for r in requests] == [0, 1, 2, 0, 1, 0, 1]


def test_a_codex_session_keeps_its_key_for_turns_on_end() -> None:
    found = [read(codex_turn_body("fix the parser", turn)) for turn in (1, 2, 3, 4)]
    assert len({f.key for f in found}) == 1
    assert [f.turn for f in found] == [0, 1, 2, 3]
    assert read(codex_turn_body("write the docs", 1)).key != found[0].key


def test_only_items_that_are_all_context_are_passed_over() -> None:
    """A user item with the prompt after the context in it, or only mentioning a marker,
    is the person's own: the key ends there, and what follows does not change it."""
    context = opening()[2]["content"]
    prompt = {"type": "input_text", "text": "fix the parser; see <environment_context>"}
    mixed = {"type": "message", "role": "user", "content": [*context, prompt]}
    later = {"type": "message", "role": "user", "content": "and run the tests"}
    one = read({"model": "m", "input": [mixed]})
    assert read({"model": "m", "input": [mixed, later]}).key == one.key
    prompt["text"] = "write the docs"
    assert read({"model": "m", "input": [mixed]}).key != one.key


def test_a_responses_body_without_codex_s_context_keeps_the_key_it_had() -> None:
    """No context item: the key is what it was before context was passed over (a value a
    replica of the version before computes too)."""
    items = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "fix the parser"}],
        },
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    found = read({"model": "m", "instructions": "You are Codex.", "input": items})
    assert found.key == bytes.fromhex("4f2b9c1b0bcea1b01b58538c17971ed0") and found.turn == 1

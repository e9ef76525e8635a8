"""crossbar.testing.simulator.toolcalls: the tool call a forced request is answered with:
the tool picked, plain values for its schema's required properties, written a few letters
a token."""

from __future__ import annotations

import json

from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.toolcalls import ToolCall, Written, pick, random_id

BASH = {
    "name": "Bash",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "background": {"type": "boolean"},
            "note": {"type": "string"},
        },
        "required": ["command", "timeout", "background"],
    },
}
READ = {"name": "Read", "input_schema": {"type": "object"}}


def test_ids_are_32_letters_and_digits_each_new() -> None:
    first, second = random_id(), random_id()
    assert len(first) == 32 and first.isalnum()
    assert first != second


def test_the_named_tool_is_called_with_its_required_properties_filled() -> None:
    call = pick([READ, BASH], "Bash", "input_schema")
    assert call is not None and call.name == "Bash"
    assert json.loads(call.arguments) == {"command": "abcdefgh", "timeout": 1, "background": True}


def test_without_a_name_the_first_tool_is_called_and_an_unlisted_one_never() -> None:
    first = pick([READ, BASH], None, "input_schema")
    assert first is not None and (first.name, first.arguments) == ("Read", "{}")
    assert pick([READ], "Write", "input_schema") is None
    assert pick("not a list", None, "input_schema") is None
    assert pick([{"name": 3}, BASH], None, "input_schema").name == "Bash"  # type: ignore[union-attr]


def test_arguments_are_written_a_few_letters_a_token_and_add_up() -> None:
    call = ToolCall("Bash", '{"command":"ls"}')
    pieces = list(call.pieces(5))
    assert pieces == ['{"com', 'mand"', ':"ls"', "}"]
    assert "".join(pieces) == call.arguments
    assert call.tokens(5) == 4
    assert ToolCall("Read", "").tokens(5) == 1


def test_a_forced_call_is_never_cut_by_the_token_limit() -> None:
    cut = Reply.to({"max_tokens": 1}, chat=True, model="m", created=1, chunks=10, pace=0.01)
    call = ToolCall("Bash", '{"command":"make test"}')
    written = Written(cut, 3, call)

    assert written.said == call.arguments
    assert written.tokens == call.tokens(3)
    assert written.kept(6) == call.arguments[:6]
    plain = Written(cut, 3, None)
    assert (plain.tokens, plain.said, plain.kept(2)) == (1, "abc", "ab")

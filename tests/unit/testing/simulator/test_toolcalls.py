"""crossbar.testing.simulator.toolcalls: the tool call a forced request is answered with:
the tool picked, plain values for its schema's required properties, written a few letters
a token; and the call that writes a file an agent asks for, then the words that end its turn."""

from __future__ import annotations

import json

from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.toolcalls import (
    Offered,
    ToolCall,
    Written,
    file_call,
    offered,
    pick,
    random_id,
)

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


# -- a file an agent asks for -----------------------------------------------------------------

WRITE = Offered(
    "Write",
    {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["file_path", "content"],
    },
)
EDIT = Offered(
    "Edit",
    {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"}},
        "required": ["file_path", "old_string"],
    },
)
EXEC = Offered(
    "exec_command",
    {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)
SHELL = Offered(
    "shell",
    {"type": "object", "properties": {"command": {"type": "array"}}, "required": ["command"]},
)
READ_ONLY = Offered("Read", {"type": "object", "properties": {"file_path": {"type": "string"}}})
ASKED = [
    {"role": "system", "content": "You are an agent.\n - Primary working directory: /home/me/proj"},
    {"role": "user", "content": "<system-reminder>\nSee notes.md.\n</system-reminder>\n"},
    {"role": "user", "content": [{"type": "text", "text": "create hello.py that prints hello"}]},
]


def called(tools: list[Offered], messages: list[object]) -> tuple[str, object]:
    call = file_call(tools, messages)
    assert isinstance(call, ToolCall), call
    assert len(call.id) == 32 and call.id.isalnum()
    return call.name, json.loads(call.arguments)


def test_a_file_asked_for_is_written_with_the_write_tool_at_its_absolute_path() -> None:
    assert called([EDIT, EXEC, WRITE], ASKED) == (
        "Write",
        {"file_path": "/home/me/proj/hello.py", "content": 'print("hello")\n'},
    )
    codex = [
        {
            "role": "user",
            "content": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>",
        }
    ]
    codex.append({"role": "user", "content": "please write notes.txt"})
    assert called([WRITE], codex) == ("Write", {"file_path": "/w/notes.txt", "content": "hello\n"})
    assert called([WRITE], ASKED[2:])[1] == {"file_path": "hello.py", "content": 'print("hello")\n'}


def test_without_a_write_tool_a_command_writes_the_file_in_the_working_directory() -> None:
    assert called([READ_ONLY, EXEC], ASKED) == (
        "exec_command",
        {"cmd": "echo 'print(\"hello\")' > hello.py"},
    )
    create = [{"role": "user", "content": "Create a file with a greeting"}]
    assert called([SHELL], create) == (
        "shell",
        {"command": ["bash", "-lc", "echo hello > hello.txt"]},
    )


def test_after_the_tools_result_the_turn_ends_in_words() -> None:
    done = [*ASKED, {"role": "assistant", "content": ""}, {"role": "tool", "content": "ok"}]
    assert file_call([WRITE], done) == "Created hello.py."


def test_without_a_file_asked_or_a_tool_to_write_it_nothing_is_called() -> None:
    assert file_call([WRITE], [{"role": "user", "content": "say hi"}]) is None
    assert file_call([WRITE], [{"role": "user", "content": "fix the test in parser.py"}]) is None
    assert file_call([WRITE], [{"role": "user", "content": "write a poem"}]) is None
    assert file_call([WRITE], ASKED[:2]) is None  # named only in a system reminder
    assert file_call([], ASKED) is None
    assert file_call([READ_ONLY, EDIT], ASKED) is None
    assert file_call([WRITE], []) is None


def test_the_tools_offered_are_read_from_each_apis_list() -> None:
    tools = [{"name": "Write", "input_schema": {"type": "object"}}, {"name": 3}, "x"]
    assert offered(tools, "input_schema") == [Offered("Write", {"type": "object"})]
    assert offered(None, "parameters") == []


def test_a_written_call_or_words_are_counted_as_written_and_end_by_themselves() -> None:
    cut = Reply.to({"max_tokens": 1}, chat=True, model="m", created=1, chunks=10, pace=0.01)
    call = Written.to(cut, 4, None, [WRITE], ASKED)
    assert call.tool is not None and call.reply.finish == "tool_calls"
    assert call.reply.usage["completion_tokens"] == call.tokens == call.tool.tokens(4)
    assert call.reply.timings["predicted_n"] == call.tokens
    assert "".join(call.pieces()) == call.tool.arguments
    done = [*ASKED, {"role": "tool", "content": "ok"}]
    words = Written.to(cut, 4, None, [WRITE], done)
    assert (words.tool, words.said, words.tokens, words.reply.finish) == (
        None,
        "Created hello.py.",
        5,
        "stop",
    )
    assert list(words.pieces()) == ["Crea", "ted ", "hell", "o.py", "."]
    assert words.kept(7) == "Created"
    plain = Written.to(cut, 4, None, [WRITE], [{"role": "user", "content": "say hi"}])
    assert (plain.tool, plain.words, plain.reply) == (None, None, cut)

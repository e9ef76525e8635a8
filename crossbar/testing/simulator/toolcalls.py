"""A tool call the simulator makes, for the agent APIs: when a request forces one, or when an
agent asks for a file.

Pure data, no Twisted.  A model given ``tool_choice`` that names a tool (or asks for any tool)
answers with a call instead of text; the simulator's call names that tool (or the first one)
and fills in the schema's required properties with plain values, so that an agent can parse
it.  Its arguments are streamed a few letters a token, as a model writes them, and it is never
cut short by a token limit: a call is complete or it is not a call.

So that an agent can be tried end to end, a request that offers a tool that writes a file or
runs a command, and whose last user text asks to create (write, make, add...) a file it names
(``hello.py``) or "a file", is answered with a call that writes it: a write tool
(``file_path``/``filePath`` and ``content``) gets the file's path (absolute, in the working
directory the agent's prompt names) and a line of content; a command tool (``command``/``cmd``)
a shell command that writes it.  Once the tool's result is the last message, the turn ends in
a few words ("Created hello.py.").  Any other request is answered as before.
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

from crossbar.testing.simulator.completions import Reply, text

_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_PLAIN = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}, "null": None}


def random_id() -> str:
    """llama-server's ``random_string()``: 32 letters and digits (tool call ids, item ids)."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(32))


def _pieces(said: str, size: int) -> Iterator[str]:
    """``said`` as a model writes it, ``size`` letters a token."""
    size = max(size, 1)
    for start in range(0, len(said), size):
        yield said[start : start + size]


def _tokens(said: str, size: int) -> int:
    return max(1, -(-len(said) // max(size, 1)))


def _arguments(schema: object) -> dict[str, Any]:
    """A value for each required property of a JSON schema: text for strings, else plain."""
    if not isinstance(schema, Mapping):
        return {}
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return {}
    values: dict[str, Any] = {}
    for name in required:
        spec = properties.get(name) if isinstance(name, str) else None
        if not isinstance(spec, Mapping):
            continue
        kind = spec.get("type")
        values[name] = _PLAIN.get(kind, text(0, 8)) if isinstance(kind, str) else ""
    return values


@dataclass(frozen=True)
class ToolCall:
    """One call of the tool ``name`` with ``arguments`` (JSON text)."""

    name: str
    arguments: str
    id: str = field(default_factory=random_id)

    @classmethod
    def of(cls, name: str, schema: object) -> ToolCall:
        return cls(name, json.dumps(_arguments(schema), separators=(",", ":")))

    def pieces(self, size: int) -> Iterator[str]:
        """The arguments as the model writes them, ``size`` letters a token."""
        return _pieces(self.arguments, size)

    def tokens(self, size: int) -> int:
        return _tokens(self.arguments, size)


class Offered(NamedTuple):
    """A tool a request offers: its name and its parameters' JSON schema."""

    name: str
    schema: object


def offered(tools: object, schema_key: str) -> list[Offered]:
    """The named tools of a request's ``tools`` list; ``schema_key`` is where each keeps its
    parameters' schema (``input_schema`` for Anthropic, ``parameters`` for Responses)."""
    if not isinstance(tools, list):
        return []
    named = [t for t in tools if isinstance(t, Mapping) and isinstance(t.get("name"), str)]
    return [Offered(t["name"], t.get(schema_key)) for t in named]


def pick(tools: object, name: str | None, schema_key: str) -> ToolCall | None:
    """The call of the tool ``name`` among ``tools`` (``None``: the first one), if listed."""
    for tool in offered(tools, schema_key):
        if name is None or tool.name == name:
            return ToolCall.of(tool.name, tool.schema)
    return None


# -- a file asked for ---------------------------------------------------------------------------

_TAGGED = re.compile(r"<([\w-]+)>.*?</\1>", re.S)  # system reminders, environment context
_FILE = re.compile(
    r"(?<![\w/.-])(/?(?:[\w.-]+/)*[\w-]+\.(?:py|txt|md|js|ts|sh|json|html|css|c|rs|go|toml|yaml))\b"
)
_CREATE = re.compile(r"\b(?:create|write|make|add|generate|save)\b", re.I)
_A_FILE = re.compile(r"\bfile\b", re.I)
_CWD = re.compile(r"(?:<cwd>|[Ww]orking directory: )([^<\s]+)")
_LINES = {".py": 'print("hello")', ".js": 'console.log("hello");', ".sh": "echo hello"}
_PATHS = ("file_path", "filePath", "path")
_COMMANDS = ("command", "cmd")


def _text(content: object) -> str:
    """A message's text: itself, or its parts' text one after another."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, Mapping)]
        return "".join(p["text"] for p in parts if isinstance(p.get("text"), str))
    return ""


def _asked(messages: Sequence[object]) -> str | None:
    """The file the last user text asks to create (its tagged blocks left out): the one it
    names, or ``hello.txt`` for "a file"; ``None`` when it asks for none."""
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        said = _TAGGED.sub("", _text(message.get("content"))).strip()
        if not said:
            continue
        if not _CREATE.search(said):
            return None  # "fix parser.py" asks for no new file
        named = _FILE.search(said)
        if named:
            return named.group(1)
        return "hello.txt" if _A_FILE.search(said) else None
    return None


def _cwd(messages: Sequence[object]) -> str | None:
    """The working directory the agent's prompt names (its last mention), if any."""
    found = None
    for message in messages:
        if isinstance(message, Mapping):
            for match in _CWD.finditer(_text(message.get("content"))):
                found = match.group(1)
    return found


def _properties(schema: object) -> Mapping[str, Any]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return properties if isinstance(properties, Mapping) else {}


def _writing(tool: Offered, path: str, cwd: str | None) -> dict[str, Any] | None:
    """The arguments of ``tool`` that write the file ``path``, if it is a write tool."""
    properties = _properties(tool.schema)
    where = next((p for p in _PATHS if p in properties), None)
    if where is None or "content" not in properties:
        return None
    line = _LINES.get(posixpath.splitext(path)[1], "hello")
    full = posixpath.join(cwd, path) if cwd else path
    return _arguments(tool.schema) | {where: full, "content": line + "\n"}


def _running(tool: Offered, path: str) -> dict[str, Any] | None:
    """The arguments of ``tool`` that write the file ``path`` with a shell command, if it
    runs commands (relative paths resolve in the agent's working directory)."""
    properties = _properties(tool.schema)
    key = next((k for k in _COMMANDS if k in properties), None)
    if key is None:
        return None
    line = _LINES.get(posixpath.splitext(path)[1], "hello")
    command = f"echo {shlex.quote(line)} > {shlex.quote(path)}"
    spec = properties[key]
    as_list = isinstance(spec, Mapping) and spec.get("type") == "array"
    return _arguments(tool.schema) | {key: ["bash", "-lc", command] if as_list else command}


def file_call(tools: Sequence[Offered], messages: Sequence[object]) -> ToolCall | str | None:
    """What a model says to a request that asks for a file: the call that writes it (a write
    tool first, else a command tool), or the turn's last words once the last message is a
    tool's result; ``None`` when no file is asked for or no tool can write it."""
    path = _asked(messages)
    if path is None or not tools:
        return None
    last = messages[-1] if messages else None
    if isinstance(last, Mapping) and last.get("role") == "tool":
        return f"Created {path}."
    cwd = _cwd(messages)
    for make in (lambda t: _writing(t, path, cwd), lambda t: _running(t, path)):
        for tool in tools:
            arguments = make(tool)
            if arguments is not None:
                return ToolCall(tool.name, json.dumps(arguments, separators=(",", ":")))
    return None


@dataclass(frozen=True)
class Written:
    """What a model wrote for one answer, in any API: text (the generated one, or ``words``
    that end a turn), or a ``tool``'s call."""

    reply: Reply
    size: int  # letters a token
    tool: ToolCall | None
    words: str | None = None

    @classmethod
    def to(
        cls,
        reply: Reply,
        size: int,
        forced: ToolCall | None,
        tools: Sequence[Offered],
        messages: Sequence[object],
    ) -> Self:
        """What a model writes to a request: the ``forced`` call, else the call of a file
        asked for or the words after it (:func:`file_call`), else the generated text; its
        usage counts the tokens written, and an answer of its own ends by itself."""
        chosen = forced if forced is not None else file_call(tools, messages)
        if chosen is None:
            return cls(reply, size, None)
        if isinstance(chosen, ToolCall):
            return cls(reply.retold(chosen.tokens(size), "tool_calls"), size, chosen)
        return cls(reply.retold(_tokens(chosen, size), "stop"), size, None, chosen)

    @property
    def tokens(self) -> int:
        return self.reply.tokens if self.tool is None else self.tool.tokens(self.size)

    @property
    def said(self) -> str:
        """What the model wrote: the text, or the call's arguments."""
        if self.tool is not None:
            return self.tool.arguments
        return self.reply.content(self.size) if self.words is None else self.words

    def pieces(self) -> Iterator[str]:
        """What the model wrote, a token at a time."""
        if self.tool is not None:
            return self.tool.pieces(self.size)
        if self.words is not None:
            return _pieces(self.words, self.size)
        return (text(i * self.size, self.size) for i in range(self.reply.tokens))

    def kept(self, limit: int) -> str:
        """The first ``limit`` letters of what the model wrote (what a slot keeps)."""
        if self.tool is None and self.words is None:
            return text(0, min(self.reply.tokens * self.size, limit))
        return self.said[:limit]

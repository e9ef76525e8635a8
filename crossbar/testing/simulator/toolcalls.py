"""A tool call the simulator makes when a request forces one, for the agent APIs.

Pure data, no Twisted.  A model given ``tool_choice`` that names a tool (or asks for any tool)
answers with a call instead of text; the simulator's call names that tool (or the first one)
and fills in the schema's required properties with plain values, so that an agent can parse
it.  Its arguments are streamed a few letters a token, as a model writes them, and it is never
cut short by a token limit: a call is complete or it is not a call.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from crossbar.testing.simulator.completions import Reply, text

_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_PLAIN = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}, "null": None}


def random_id() -> str:
    """llama-server's ``random_string()``: 32 letters and digits (tool call ids, item ids)."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(32))


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
        size = max(size, 1)
        for start in range(0, len(self.arguments), size):
            yield self.arguments[start : start + size]

    def tokens(self, size: int) -> int:
        return max(1, -(-len(self.arguments) // max(size, 1)))


def pick(tools: object, name: str | None, schema_key: str) -> ToolCall | None:
    """The call of the tool ``name`` among ``tools`` (``None``: the first one), if listed.

    ``schema_key`` is where each tool keeps its parameters' schema (``input_schema`` for
    Anthropic, ``parameters`` for Responses).
    """
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            continue
        if name is None or tool["name"] == name:
            return ToolCall.of(tool["name"], tool.get(schema_key))
    return None


@dataclass(frozen=True)
class Written:
    """What a model wrote for one answer, in any API: text, or the forced ``tool``'s call."""

    reply: Reply
    size: int  # letters a token
    tool: ToolCall | None

    @property
    def tokens(self) -> int:
        return self.reply.tokens if self.tool is None else self.tool.tokens(self.size)

    @property
    def said(self) -> str:
        """What the model wrote: the text, or the call's arguments."""
        return self.reply.content(self.size) if self.tool is None else self.tool.arguments

    def kept(self, limit: int) -> str:
        """The first ``limit`` letters of what the model wrote (what a slot keeps)."""
        if self.tool is None:
            return text(0, min(self.reply.tokens * self.size, limit))
        return self.tool.arguments[:limit]

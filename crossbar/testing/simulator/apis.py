"""The APIs a llama-server generates through, and what each makes of a request and an answer.

Pure data, no Twisted.  llama-server serves four: OpenAI's chat completions and text
completions, Anthropic's Messages (Claude Code) and OpenAI's Responses (Codex).  The last two
are turned into a chat completion first, so one prompt cache and one generator serve them
all; only the request's reading and the answer's shape differ.  Each also counts a prompt's
tokens without generating (``count_tokens`` / ``input_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from crossbar.testing.simulator import messages, responses
from crossbar.testing.simulator.cache import Tokens, prompt_tokens
from crossbar.testing.simulator.completions import Reply, text

Api = Literal["chat", "text", "messages", "responses"]

GENERATE: dict[str, Api] = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "text",
    "/completions": "text",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/responses": "responses",
}
"""Paths that generate, and their API (llama-server's ``server.cpp`` routes)."""

COUNT: dict[str, Api] = {
    "/v1/messages/count_tokens": "messages",
    "/v1/responses/input_tokens": "responses",
    "/responses/input_tokens": "responses",
    "/v1/chat/completions/input_tokens": "chat",
    "/chat/completions/input_tokens": "chat",
}
"""Paths that count a prompt's tokens, and the API whose request they read."""


def to_chat(api: Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat (or text) completion request that ``body`` amounts to."""
    if api == "messages":
        return messages.to_chat(body)
    if api == "responses":
        return responses.to_chat(body)
    return dict(body)


def prompt(api: Api, body: Mapping[str, Any]) -> Tokens:
    """A request's prompt tokens, as the prompt cache sees them."""
    return prompt_tokens(to_chat(api, body), chat=api != "text")


def counted(api: Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """The answer of a token count: ``input_tokens``, and an ``object`` on OpenAI's paths."""
    answer: dict[str, Any] = {"input_tokens": len(prompt(api, body))}
    if api != "messages":
        answer["object"] = "response.input_tokens"
    return answer


class Shaped(Protocol):
    """An answer in its API's shape."""

    @property
    def tokens(self) -> int: ...
    def kept(self, limit: int) -> str: ...
    def whole(self) -> dict[str, Any]: ...
    def events(self) -> Iterator[tuple[bool, bytes]]: ...


@dataclass(frozen=True)
class _OpenAI:
    """A chat or text completion: ``Reply`` has its shapes already."""

    reply: Reply
    size: int
    with_usage: bool

    @property
    def tokens(self) -> int:
        return self.reply.tokens

    def kept(self, limit: int) -> str:
        return text(0, min(self.reply.tokens * self.size, limit))

    def whole(self) -> dict[str, Any]:
        return self.reply.whole(self.size)

    def events(self) -> Iterator[tuple[bool, bytes]]:
        return self.reply.events(self.size, self.with_usage)


def shape(api: Api, body: Mapping[str, Any], reply: Reply, size: int) -> Shaped:
    """``reply`` (``size`` letters a token) as ``api`` answers ``body``."""
    if api == "messages":
        return messages.MessagesAnswer(reply, size, messages.forced_tool(body))
    if api == "responses":
        return responses.ResponsesAnswer(reply, size, responses.forced_tool(body))
    options = body.get("stream_options")
    with_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    return _OpenAI(reply, size, with_usage)

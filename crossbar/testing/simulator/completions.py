"""What a model generates for one completion request: how long, which text, what it counts.

Pure data, no Twisted, like ``replies``.  A real model ends an answer by itself (it samples
its end-of-generation token) after a length of its own, and a token limit only cuts that
short.  Agents ask for ``"max_tokens": 32000`` and wait for the end, so an answer that always
ran to the limit would keep them waiting for half an hour at a demo's pace.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from crossbar.testing.simulator.replies import BUILD_INFO, dumps

NATURAL = (8, 60)
"""Fewest and most tokens of an answer that ends by itself: a few seconds at 50 ms a token."""

_LIMITS = ("n_predict", "max_completion_tokens", "max_tokens")
"""Where llama-server reads a token limit from, first found first, on its own and on the
OpenAI-compatible endpoints alike (``max_completion_tokens`` is accepted for text too)."""

_DRAW_A_SEED = 0xFFFFFFFF  # llama-server's default seed (-1 wraps to it): a fresh one per request
_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def text(start: int, size: int) -> str:
    """Deterministic generated text: ``size`` letters starting at offset ``start``."""
    offset = start % len(_ALPHABET)
    return (_ALPHABET * ((offset + size) // len(_ALPHABET) + 1))[offset : offset + size]


def _integer(value: object) -> int | None:
    """``value`` if it is a JSON integer (``true`` is not one), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    """``value`` if it is a JSON number, else ``None``."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def token_limit(body: Mapping[str, Any]) -> int | None:
    """The request's token limit, or ``None``: the first of ``_LIMITS`` that is an integer
    (llama-server skips a value of another type); a negative one, as -1, sets no limit."""
    for key in _LIMITS:
        value = _integer(body.get(key))
        if value is not None:
            return value if value >= 0 else None
    return None


def _prompt(body: Mapping[str, Any]) -> Any:
    return body.get("messages", body.get("prompt", ""))


def natural_length(body: Mapping[str, Any], model: str) -> int:
    """How many tokens ``model`` says before it stops by itself, within :data:`NATURAL`.

    As with a sampler, the seed and the prompt decide: the same ones give the same answer,
    and so does greedy sampling (temperature 0) whatever the seed.  Without a seed
    llama-server draws a fresh one for every request, so the length varies.
    """
    temperature = _number(body.get("temperature"))
    greedy = temperature is not None and temperature <= 0
    seed = _integer(body.get("seed"))
    seed = None if seed is None or seed % 2**32 == _DRAW_A_SEED else seed % 2**32
    low, high = NATURAL
    if not greedy and seed is None:
        return random.randint(low, high)
    key = dumps([model, None if greedy else seed, _prompt(body)])
    drawn = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return low + drawn % (high - low + 1)


@dataclass(frozen=True)
class Reply:
    """The OpenAI-shaped pieces of one generated answer of ``tokens`` tokens."""

    chat: bool
    model: str
    created: int
    tokens: int
    finish: str
    usage: dict[str, Any]
    timings: dict[str, float]
    # "chatcmpl-" for text completions too: llama-server says so.
    id: str = field(
        default_factory=lambda: "chatcmpl-" + "".join(secrets.choice(_ID_CHARS) for _ in range(32))
    )

    @classmethod
    def to(
        cls,
        body: Mapping[str, Any],
        *,
        chat: bool,
        model: str,
        created: int,
        chunks: int | None,
        pace: float,
        cache_n: int = 0,
        prompt_n: int = 1,
        prompt_ms: float = 1.0,
    ) -> Reply:
        """The answer to a request ``body``: ``chunks`` tokens (``None``: the model's natural
        length), cut to the request's limit if that is not more ("length" instead of
        "stop": the limit is reached before the end token is sampled).  Usage and timings
        count as llama-server does: ``pace`` seconds a token; of the prompt, ``cache_n``
        tokens reused and ``prompt_n`` processed in ``prompt_ms``."""
        length = natural_length(body, model) if chunks is None else chunks
        limit = token_limit(body)
        n, finish = (limit, "length") if limit is not None and limit <= length else (length, "stop")
        prompt = cache_n + prompt_n
        usage = {
            "completion_tokens": n,
            "prompt_tokens": prompt,
            "total_tokens": n + prompt,
            "prompt_tokens_details": {"cached_tokens": cache_n},
        }
        ms = max(pace, 0.001) * 1000  # a token
        timings = {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n,
            "prompt_per_second": 1000 / prompt_ms * prompt_n,
            "predicted_n": n,
            "predicted_ms": n * ms,
            # per token as paced even for no token, where llama-server divides by zero
            "predicted_per_token_ms": ms,
            "predicted_per_second": 1000 / ms,
        }
        return cls(chat, model, created, n, finish, usage, timings)

    def retold(self, tokens: int, finish: str) -> Reply:
        """This reply of another ``tokens`` tokens that ends by itself (``finish``): what a
        model writes of its own (a tool call, a turn's last words), counted as written."""
        usage = self.usage | {
            "completion_tokens": tokens,
            "total_tokens": tokens + self.usage["prompt_tokens"],
        }
        ms = self.timings["predicted_per_token_ms"]
        timings = self.timings | {"predicted_n": tokens, "predicted_ms": tokens * ms}
        return replace(self, tokens=tokens, finish=finish, usage=usage, timings=timings)

    def content(self, size: int) -> str:
        """The whole generated text, ``size`` letters a token: what a stream adds up to."""
        return text(0, self.tokens * size)

    def whole(self, size: int, message: dict[str, Any] | None = None) -> dict[str, Any]:
        """The non-streamed answer, ``size`` letters a token (a chat answer's ``message``
        when it is not the generated text)."""
        content = self.content(size) if message is None else ""
        if self.chat:
            message = message or {"role": "assistant", "content": content}
            choice = {"finish_reason": self.finish, "index": 0, "message": message}
        else:
            choice = {"text": content, "index": 0, "logprobs": None, "finish_reason": self.finish}
        return {
            "choices": [choice],
            "created": self.created,
            "model": self.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion" if self.chat else "text_completion",
            "usage": self.usage,
            "id": self.id,
            "timings": self.timings,
        }

    def events(
        self, size: int, with_usage: bool, deltas: Iterable[dict[str, Any]] | None = None
    ) -> Iterator[tuple[bool, bytes]]:
        """(paced, bytes) for every SSE event, generated lazily: streams may be huge; a chat
        answer's ``deltas`` a token when it is not the generated text.

        Chat chunks carry the id before the model; text completion chunks after the object,
        and their last chunk always has the usage (``include_usage`` adds nothing). A chat
        stream's finish chunk has the timings, unless ``include_usage`` asked for one more
        chunk with the usage: then that one has them.
        """
        if self.chat:
            role = {"role": "assistant", "content": None}
            yield False, self._event([{"finish_reason": None, "index": 0, "delta": role}])
        if deltas is None:
            deltas = ({"content": text(i * size, size)} for i in range(self.tokens))
        for delta in deltas:
            yield True, self._event([self._choice(None, delta)])
        last = [self._choice(self.finish, None)]
        if not self.chat:
            yield False, self._event(last, usage=self.usage, timings=self.timings)
        elif with_usage:
            yield False, self._event(last)
            yield False, self._event([], usage=self.usage, timings=self.timings)
        else:
            yield False, self._event(last, timings=self.timings)
        yield False, b"data: [DONE]\n\n"

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        if self.chat:
            head = {"choices": choices, "created": self.created, "id": self.id}
            doc = head | {
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk",
            }
        else:
            doc = {
                "choices": choices,
                "created": self.created,
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "text_completion",
            }
            usage = extra.pop("usage", None)
            if usage is not None:
                doc["usage"] = usage
            doc["id"] = self.id
        return b"data: " + dumps(doc | extra) + b"\n\n"

    def _choice(self, finish: str | None, delta: dict[str, Any] | None) -> dict[str, Any]:
        if not self.chat:
            said = "" if delta is None else delta.get("content", "")
            return {"text": said, "index": 0, "logprobs": None, "finish_reason": finish}
        return {"finish_reason": finish, "index": 0, "delta": delta or {}}

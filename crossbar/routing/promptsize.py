"""How many tokens a request's prompt has, guessed before it is sent, from what crossbar
has at hand: the body's length in bytes, its API, and what earlier answers reported.

A host counts a prompt with its model's tokenizer after rendering the chat template;
crossbar does neither (a tokenizer per model, and a second decode of the body, would cost
more than the request's routing). It learns instead, per model and API, how many bytes of
request body one prompt token takes, from each answer's own ``usage`` (its prompt tokens,
cached ones included) against the body that asked for it. A Responses body of Codex's
(its tools and instructions as JSON) takes other bytes a token than a chat of plain text,
so each API of a model is learned on its own.

A conversation is guessed better: every turn resends the one before and adds to it, so
its last reported prompt tokens plus the bytes added since, at the learned rate, leave
only the new part to guess. A host's refusal of a prompt too long tells its exact tokens
(``n_prompt_tokens``), learned the same way.

Before anything is learned a model's API is guessed at :data:`FIRST_BYTES_PER_TOKEN`
(few, so as to guess too many rather than too few tokens only for bodies that are mostly
JSON). Every table is bounded (:data:`MAX_RATES`, :data:`MAX_CONVERSATIONS`; the least
recently used entry goes first). Pure, no I/O: the proxy feeds it (body bytes, prompt
tokens) as answers end.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

FIRST_BYTES_PER_TOKEN = 3.0
"""Bytes of body per prompt token assumed for a model and API not seen yet: JSON-escaped
English and code run 3 to 4.5 (measured on crossbar's benchmark bodies), tools and their
schemas less."""
LEARN_WEIGHT = 0.25
"""Weight of each new answer in the learned rate (an exponential mean: the rate follows a
change of agent or tools within a few answers, and one odd answer moves it little)."""
MIN_BYTES_PER_TOKEN = 0.5
MAX_BYTES_PER_TOKEN = 64.0
"""An answer that says fewer than 1 token in 64 bytes, or more than 2 a byte, teaches
nothing: a host that counted something else (a tokenizer error, a cached count)."""
MIN_LEARN_BYTES = 256
"""Bodies shorter than this teach no rate: their template's own tokens weigh too much."""
MAX_RATES = 1024
"""(model, API) pairs whose rate is kept."""
MAX_CONVERSATIONS = 20_000
"""Conversations whose last size is kept (a few dozen bytes each)."""


@attrs.frozen
class Estimate:
    """A prompt's tokens as guessed, and how: ``conversation`` (its last turn's reported
    tokens plus the bytes added), ``learned`` (this model's rate), or ``first`` (no answer
    of this model and API seen yet)."""

    tokens: int
    how: str


class _Seen:
    __slots__ = ("body_bytes", "tokens")

    def __init__(self, body_bytes: int, tokens: int) -> None:
        self.body_bytes = body_bytes
        self.tokens = tokens


class PromptSizes:
    """Bytes per token per model and API, and each conversation's last size: fed with
    what answers reported (:meth:`learn`), asked before a request is sent (:meth:`estimate`)."""

    def __init__(
        self,
        first_bytes_per_token: float = FIRST_BYTES_PER_TOKEN,
        max_rates: int = MAX_RATES,
        max_conversations: int = MAX_CONVERSATIONS,
    ) -> None:
        self.first_bytes_per_token = first_bytes_per_token
        self._rates: OrderedDict[tuple[str | None, str], float] = OrderedDict()
        self._conversations: OrderedDict[bytes, _Seen] = OrderedDict()
        self._max_rates = max_rates
        self._max_conversations = max_conversations

    def rate(self, model: str | None, api: str) -> float | None:
        """The learned bytes per token of ``model`` on ``api``, or ``None``."""
        return self._rates.get((model, api))

    def estimate(
        self, model: str | None, api: str, body_bytes: int, conversation: bytes | None = None
    ) -> Estimate:
        """The prompt tokens of a body of ``body_bytes`` bytes for ``model`` on ``api``;
        ``conversation``: its key, when the route's policy reads one."""
        learned = self._rates.get((model, api))
        rate = self.first_bytes_per_token if learned is None else learned
        seen = None if conversation is None else self._conversations.get(conversation)
        if seen is not None and body_bytes >= seen.body_bytes:
            added = (body_bytes - seen.body_bytes) / rate
            return Estimate(seen.tokens + round(added), "conversation")
        return Estimate(round(body_bytes / rate), "first" if learned is None else "learned")

    def learn(
        self,
        model: str | None,
        api: str,
        body_bytes: int,
        tokens: int,
        conversation: bytes | None = None,
    ) -> None:
        """An answer (or a refusal) said a body of ``body_bytes`` bytes had ``tokens``
        prompt tokens. Numbers that cannot be a prompt's teach nothing."""
        if tokens <= 0 or body_bytes <= 0:
            return
        ratio = body_bytes / tokens
        if not MIN_BYTES_PER_TOKEN <= ratio <= MAX_BYTES_PER_TOKEN:
            return
        if conversation is not None:
            conversations = self._conversations
            conversations[conversation] = _Seen(body_bytes, tokens)
            conversations.move_to_end(conversation)
            if len(conversations) > self._max_conversations:
                conversations.popitem(last=False)
        if body_bytes < MIN_LEARN_BYTES:
            return
        key = (model, api)
        rates = self._rates
        old = rates.get(key)
        rates[key] = ratio if old is None else old + LEARN_WEIGHT * (ratio - old)
        rates.move_to_end(key)
        if len(rates) > self._max_rates:
            rates.popitem(last=False)

"""A llama-server's prompt cache: its slots and its host-memory cache, as the simulator keeps them.

Pure data, no Twisted, like ``completions``.  It follows llama.cpp's ``tools/server``
(``get_available_slot`` and ``server_prompt_cache``) so that what a router does to a
conversation's cache shows in ``timings.cache_n`` / ``prompt_n`` the way it would on a real
host:

- a new request takes the idle slot whose tokens share the longest prefix with its prompt, if
  that prefix is more than ``similarity`` (``--slot-prompt-similarity``, 0.1) of the prompt;
  else the least recently used idle slot (the last of equals, as llama-server's ``<=`` picks);
- a slot chosen by recency, or by a match that keeps less than half of what it holds, first
  saves what it holds to host memory (``--cache-ram``) and takes from there the saved prompt
  that keeps the most of both, if any keeps at least a quarter of itself; saved prompts are
  dropped oldest first beyond the budget, always keeping one;
- the tokens shared with the slot are reused (``cache_n``), the rest are processed
  (``prompt_n``), at least one: a model needs one to evaluate before it can answer;
- when the request ends the slot holds its prompt and the answer's tokens;
- what waits for a busy slot (a save of it) goes on once its request ends (``when_idle``).

Tokens are not a tokenizer's.  A chat is rendered as a ChatML-like template (every message as
``<|im_start|>role\\ncontent<|im_end|>\\n``, then ``<|im_start|>assistant\\n``) and text is
cut into pieces: a template marker, up to four letters or digits, one other character, or a run
of spaces.  What matters is that it is cheap and deterministic and that prefixes are shared the
way a real template shares them: every turn of a conversation starts with the previous turn's
prompt and answer, so its tokens start with the tokens the slot kept.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SIMILARITY = 0.1
"""llama-server's default ``--slot-prompt-similarity``."""

Tokens = tuple[str, ...]

_PIECES = re.compile(r"<\|[a-z_]+\|>|\w{1,4}|[^\w\s]|\s+")
_BOS = "<|bos|>"


def tokenize(text: str) -> Tokens:
    """The simulator's tokens of ``text`` (see the module's docstring)."""
    return tuple(_PIECES.findall(text))


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def render(body: Mapping[str, Any], *, chat: bool) -> str:
    """The prompt as the model would see it: a chat through the template, text as it is."""
    if not chat:
        return _text(body.get("prompt", ""))
    messages = body.get("messages")
    parts = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            parts.append(f"<|im_start|>user\n{_text(message)}<|im_end|>\n")
            continue
        content = _text(message.get("content") or "")
        rest = {k: v for k, v in message.items() if k not in ("role", "content")}
        extra = _text(rest) if rest else ""  # tool calls and the like, as the template adds them
        role = _text(message.get("role", "user"))
        parts.append(f"<|im_start|>{role}\n{content}{extra}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def prompt_tokens(body: Mapping[str, Any], *, chat: bool) -> Tokens:
    """A request's prompt tokens, beginning with the start token as llama-server adds it."""
    return (_BOS, *tokenize(render(body, chat=chat)))


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many tokens ``a`` and ``b`` share from the start.

    Compares slices (C speed) halving the range, rather than token by token in Python: a
    conversation's prompt runs to 100,000 tokens and is compared with every slot.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class Prefill:
    """What one completion found: the slot it took and what ``timings`` reports of its prompt."""

    model: str
    slot: int
    cache_n: int  # prompt tokens reused
    prompt_n: int  # prompt tokens processed
    restored: bool  # the slot took a prompt back from host memory first


@dataclass(frozen=True)
class CacheState:
    """A read-only view for tests: tokens held by each slot, which are busy, what is saved."""

    slots: tuple[int, ...]
    busy: tuple[bool, ...]
    saved: tuple[int, ...]  # tokens of each prompt in host memory, oldest first


@dataclass
class _Slot:
    id: int
    tokens: Tokens = ()
    busy: bool = False
    last_used: int = -1
    task: int | None = None  # the last request it took, as ``/slots`` shows ``id_task``


class PromptCache:
    """One model server's slots (``-np``) and host-memory cache (``cache_ram`` tokens, 0: off)."""

    def __init__(
        self, model: str, slots: int, cache_ram: int, similarity: float = SIMILARITY
    ) -> None:
        if slots < 1:
            raise ValueError("a model server has at least one slot")
        self.model = model
        self.cache_ram = cache_ram
        self.similarity = similarity
        self._slots = [_Slot(i) for i in range(slots)]
        self._saved: deque[Tokens] = deque()
        self._releases = self._tasks = 0
        self._on_idle: dict[int, list[Callable[[], None]]] = {}

    @property
    def state(self) -> CacheState:
        return CacheState(
            tuple(len(s.tokens) for s in self._slots),
            tuple(s.busy for s in self._slots),
            tuple(len(t) for t in self._saved),
        )

    def start(self, tokens: Tokens) -> Prefill | None:
        """Take a slot for a prompt, or ``None`` while every slot is busy (the request waits)."""
        slot, save = self._choose(tokens)
        if slot is None:
            return None
        restored = False
        if save and self.cache_ram > 0:
            self._save(slot.tokens)
            restored = self._load(slot, tokens)
            self._trim()
        reused = common_prefix(slot.tokens, tokens)
        if reused == len(tokens) and reused > 0:
            reused -= 1  # one token is evaluated to get the logits of the answer's first
        slot.tokens, slot.busy = tokens[:reused], True
        slot.task, self._tasks = self._tasks, self._tasks + 1
        return Prefill(self.model, slot.id, reused, len(tokens) - reused, restored)

    def finish(self, slot_id: int, tokens: Tokens) -> None:
        """The request on ``slot_id`` ended; the slot keeps ``tokens`` and becomes idle."""
        slot = self._slots[slot_id]
        slot.tokens, slot.busy = tokens, False
        slot.last_used, self._releases = self._releases, self._releases + 1
        for then in self._on_idle.pop(slot_id, []):
            then()

    def when_idle(self, slot_id: int, then: Callable[[], None]) -> None:
        """``then()`` once slot ``slot_id`` is idle: now, or when its request ends (as
        llama-server holds a save of a busy slot until then)."""
        if self._slots[slot_id].busy:
            self._on_idle.setdefault(slot_id, []).append(then)
        else:
            then()

    def listing(self) -> list[dict[str, object]]:
        """``GET /slots``: each slot, with ``id_task`` and its tokens once it took a request
        (a restore shows in neither, as on llama-server)."""
        listed: list[dict[str, object]] = []
        for s in self._slots:
            listed.append({"id": s.id, "is_processing": s.busy})
            if s.task is not None:
                listed[-1] |= {"id_task": s.task, "n_prompt_tokens": len(s.tokens)}
        return listed

    def held(self, slot_id: int) -> Tokens:
        """What slot ``slot_id`` holds (``action=save``)."""
        return self._slots[slot_id].tokens

    def restore(self, slot_id: int, tokens: Tokens) -> bool:
        """``action=restore``: the idle slot ``slot_id`` holds ``tokens`` now; ``False``
        when it is busy."""
        slot = self._slots[slot_id]
        if slot.busy:
            return False
        slot.tokens = tokens
        return True

    def _choose(self, tokens: Tokens) -> tuple[_Slot | None, bool]:
        """The slot for ``tokens`` and whether its contents go to host memory first."""
        idle = [s for s in self._slots if not s.busy]
        best, best_similarity = None, 0.0
        if self.similarity != 0:
            for slot in idle:
                if not slot.tokens:
                    continue
                shared = common_prefix(slot.tokens, tokens)
                similarity = shared / len(tokens)
                if similarity > best_similarity and similarity > self.similarity:
                    best, best_similarity = slot, similarity
        if best is not None:
            kept = best_similarity * len(tokens) / len(best.tokens)
            return best, kept < 0.5  # about to lose most of it: save it
        oldest = None
        for slot in idle:
            if oldest is None or slot.last_used <= oldest.last_used:
                oldest = slot
        return oldest, True

    def _save(self, tokens: Tokens) -> None:
        if not tokens:
            return
        if any(common_prefix(saved, tokens) == len(tokens) for saved in self._saved):
            return  # already there, whole
        self._saved = deque(s for s in self._saved if common_prefix(s, tokens) < len(s))
        self._saved.append(tokens)

    def _load(self, slot: _Slot, tokens: Tokens) -> bool:
        """Restore into ``slot`` the saved prompt that keeps most of itself and of ``tokens``."""
        shared = common_prefix(slot.tokens, tokens)
        keep_best = shared / len(slot.tokens) if slot.tokens else -1.0
        similarity_best = shared / len(tokens)
        best = None
        for saved in self._saved:
            shared = common_prefix(saved, tokens)
            keep, similarity = shared / len(saved), shared / len(tokens)
            if keep >= 0.25 and keep_best < keep and similarity_best < similarity:
                best, keep_best, similarity_best = saved, keep, similarity
        if best is None:
            return False
        self._saved.remove(best)
        slot.tokens = best
        return True

    def _trim(self) -> None:
        while len(self._saved) > 1 and sum(map(len, self._saved)) > self.cache_ram:
            self._saved.popleft()

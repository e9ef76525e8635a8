"""The numbers an answer reports of its work, checked as they come: a count that is not a
whole number, is negative or is too large, or a time that is not a number, is ignored and
counted as bad, never summed. Then, once read, checked against what is plausible for the
request (:class:`Bounds`): a host cannot charge a key a billion tokens for a short answer.
Pure, no I/O (the reader is :mod:`crossbar.usage.reader`)."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import attrs
import msgspec

MOST_TOKENS = 10**9
"""More tokens than any prompt or answer has: a larger count is a bad number."""
MOST_MS = 1e9
"""A longer time (about 11 days) or a faster speed is a bad number."""
CEILING = 10_000_000
"""Most prompt or generated tokens one answer is believed to report when nothing tighter
is known (ten times the longest context of today's models)."""
MARGIN = 64
"""Generated tokens believed past ``max_tokens`` (and a tenth of it): a host may count
an end-of-generation token or a template's closing tokens."""

Raw = msgspec.Raw | msgspec.UnsetType
_UNSET = msgspec.UNSET
_T = TypeVar("_T")
ERRORS = (msgspec.MsgspecError, RecursionError, UnicodeError, ValueError)
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
"""A small object (usage, timings, a delta), each value left unread until asked for."""


_Count = Annotated[int, msgspec.Meta(ge=0, le=MOST_TOKENS)]
_Ms = Annotated[float, msgspec.Meta(ge=0, le=MOST_MS)]


class _Cached(msgspec.Struct, omit_defaults=True, gc=False):
    cached_tokens: _Count | None = None


class GoodCounts(msgspec.Struct, omit_defaults=True, gc=False):
    """A ``usage`` object whose numbers msgspec checked as it read them, by the rules of
    :meth:`Tally.number` (most answers'): kept in one step. With one bad number the
    object is read again with each number as the JSON gave it, and checked one by one."""

    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    input_tokens: _Count | None = None
    cache_read_input_tokens: _Count | None = None
    output_tokens: _Count | None = None
    prompt_tokens_details: _Cached | None = None
    input_tokens_details: _Cached | None = None


class GoodTimings(msgspec.Struct, omit_defaults=True, gc=False):
    """``timings``, checked as :class:`GoodCounts` is."""

    cache_n: _Count | None = None
    prompt_n: _Count | None = None
    predicted_n: _Count | None = None
    prompt_ms: _Ms | None = None
    predicted_per_second: _Ms | None = None


_DETAILS = ("prompt_tokens_details", "input_tokens_details")
_TIMES = ("prompt_ms", "predicted_per_second")
"""Timings that are times (or speeds), not counts."""


def _as_given(checked: type[msgspec.Struct]) -> msgspec.json.Decoder[Any]:
    """A decoder for ``checked``'s fields, each as the JSON gave it: the names are
    ``checked``'s, the checks are :meth:`Tally.number`'s."""
    fields = [(name, Any, None) for name in checked.__struct_fields__]
    return msgspec.json.Decoder(msgspec.defstruct(f"Given{checked.__name__}", fields, gc=False))


_COUNTS_DECODER = _as_given(GoodCounts)
_TIMINGS_DECODER = _as_given(GoodTimings)


class Tally:
    """The host's numbers as they come: a later report of a field replaces an earlier one."""

    def __init__(self) -> None:
        self.fields: dict[str, float] = {}
        self.bad = 0

    def number(self, name: str, value: Any, kind: type[int] | type[float] = int) -> None:
        """``value`` as decoded: kept if it is a number of ``kind`` in range, else counted."""
        if value is None:
            return
        if kind is int:
            good = type(value) is int and 0 <= value <= MOST_TOKENS
        else:
            good = type(value) in (int, float) and 0 <= value <= MOST_MS
        if good:
            self.fields[name] = value
        else:
            self.bad += 1

    def counts(self, raw: Raw | GoodCounts | None, outputs: bool = True) -> None:
        """A ``usage`` object; ``outputs=False`` for Anthropic's ``message_start``, whose
        ``output_tokens`` is a 0 standing for "not yet"."""
        if isinstance(raw, GoodCounts):
            got = msgspec.to_builtins(raw)  # the numbers it has: the others are left out
            for details in _DETAILS:
                got.update(got.pop(details, {}))
            if not outputs:
                got.pop("output_tokens", None)
            self.fields.update(got)
            return
        found = self._decoded(_COUNTS_DECODER, raw)
        if found is None:
            return
        for name in GoodCounts.__struct_fields__:
            value = getattr(found, name)
            if name in _DETAILS:
                if isinstance(details := value, dict):
                    self.number("cached_tokens", details.get("cached_tokens"))
                elif details is not None:
                    self.bad += 1
            elif outputs or name != "output_tokens":
                self.number(name, value)

    def timings(self, raw: Raw | GoodTimings | None) -> None:
        if isinstance(raw, GoodTimings):
            self.fields.update(msgspec.to_builtins(raw))
            return
        found = self._decoded(_TIMINGS_DECODER, raw)
        if found is None:
            return
        for name in GoodTimings.__struct_fields__:
            self.number(name, getattr(found, name), float if name in _TIMES else int)

    def _decoded(self, decoder: msgspec.json.Decoder[_T], raw: Raw | None) -> _T | None:
        """``raw`` decoded; ``None`` when absent, or unreadable (counted bad)."""
        if raw is None or raw is _UNSET or bytes(raw) == b"null":
            return None
        try:
            return decoder.decode(raw)
        except ERRORS:
            self.bad += 1
            return None

    def top(self, top: Any) -> None:
        """An event's data or a body, as :mod:`crossbar.usage.reader` decoded it."""
        if top.usage is not _UNSET:
            self.counts(top.usage)
        if top.timings is not _UNSET:
            self.timings(top.timings)
        if top.message is not _UNSET:
            self.counts(self.object(top.message).get("usage"), outputs=False)
        if top.response is not _UNSET:
            self.counts(self.object(top.response).get("usage"))

    def object(self, raw: Raw | None) -> dict[str, msgspec.Raw]:
        """A JSON object's keys, or none (counted bad when it is something else)."""
        return self._decoded(_OBJECT, raw) or {}


@attrs.frozen
class Bounds:
    """What one answer may plausibly report; past it, a number is dropped (unknown, and
    counted bad) rather than charged to the key."""

    prompt: int = CEILING
    """Most prompt tokens (cached ones included): the host's context window when known."""
    generated: int = CEILING
    """Most generated tokens: the request's ``max_tokens`` and a margin when it gave one."""
    prompt_from: str = "crossbar's ceiling"
    generated_from: str = "crossbar's ceiling"

    @classmethod
    def of(cls, window: int | None = None, max_tokens: int | None = None) -> Bounds:
        """The bounds of a request: ``window``, the host's context size in tokens (if
        known); ``max_tokens``, what the request allowed (if it said)."""
        bounds = cls()
        if window is not None and 0 < window < CEILING:
            bounds = attrs.evolve(bounds, prompt=window, prompt_from="the host's window")
        if max_tokens is not None and 0 <= max_tokens < CEILING:
            most = max_tokens + max(MARGIN, max_tokens // 10)
            words = f"max_tokens {max_tokens:,} and a margin"
            bounds = attrs.evolve(bounds, generated=most, generated_from=words)
        return bounds

    def check(
        self, prompt: int | None, cached: int | None, generated: int | None
    ) -> tuple[int | None, int | None, int | None, list[str]]:
        """``(prompt, cached, generated)`` with each implausible number dropped (cached
        tokens go with their prompt), and what was dropped, in words (numbers only)."""
        dropped = []
        if prompt is not None and prompt > self.prompt:
            dropped.append(f"prompt_tokens {prompt:,} over {self.prompt:,} ({self.prompt_from})")
            prompt = cached = None
        if cached is not None and cached > self.prompt:
            dropped.append(f"cached_tokens {cached:,} over {self.prompt:,} ({self.prompt_from})")
            cached = None
        if generated is not None and generated > self.generated:
            dropped.append(
                f"completion_tokens {generated:,} over {self.generated:,} ({self.generated_from})"
            )
            generated = None
        return prompt, cached, generated, dropped

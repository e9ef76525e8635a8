"""Who used what: the tokens, cache hits and speed an answer reports, read as it streams by.

A sans-IO reader: the relay feeds it every chunk of an answer's body and asks for its
:class:`TokenUsage` at the end. It never holds the stream back and never raises.

What each API reports (llama-server, ``tools/server/server-task.cpp``):

- chat and completions: ``usage`` (``prompt_tokens`` with the cached ones, ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens``), streamed only with ``include_usage``; and
  ``timings`` (``cache_n``, ``prompt_n``, ``prompt_ms``, ``predicted_n``,
  ``predicted_per_second``) on the last chunk, or the body, always;
- Anthropic messages: ``input_tokens`` *without* the cached ones plus
  ``cache_read_input_tokens`` (in ``message_start`` and the body), ``output_tokens`` (in
  ``message_delta``); no timings, so the speed is measured here;
- Responses: ``usage.input_tokens`` (cached included), ``input_tokens_details.cached_tokens``,
  ``output_tokens`` in ``response.completed`` (or the body); no timings either.

A stream's events are read one by one only until its first content event (the time to the
first token: the head and ``:`` pings come before it); after it a chunk costs an append
(no copy, no search, no clock), the last :data:`TAIL` bytes are kept and their usage read
at the end (a ``response.completed`` longer than that from its end). The last content is
timed at the stream's end, as the closing events follow it at once.
A number absent is unknown; one not an integer (a number, for a time), negative or too
large is ignored and counted in :attr:`TokenUsage.bad`, as is what cannot be read. Pure, no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import attrs
import msgspec

from crossbar.usage.counts import ERRORS, Bounds, GoodCounts, GoodTimings, Tally
from crossbar.usage.sse import events_with, fields, trailing_objects

MAX_EVENT = 64 * 1024
"""Longest event read before the first content; a longer one is skipped and counted bad."""
TAIL = 16 * 1024
"""Bytes of a stream's end kept, after its first content, for the events that carry usage."""
MAX_BODY = 1024 * 1024
"""Longest answer that is not streamed read for its usage; past it, unknown and counted bad."""

APIS = frozenset({"chat", "completion", "anthropic", "responses"})
_UNBOUNDED = Bounds()
"""Nothing known of the request or the host: :data:`~crossbar.usage.counts.CEILING`."""

_UNSET = msgspec.UNSET
Raw = msgspec.Raw | msgspec.UnsetType
_T = TypeVar("_T")


@attrs.frozen(slots=False)  # a __dict__ is filled in fewer instructions than slots
class TokenUsage:
    """What one answer reports of its work; ``None`` where it reports nothing (or nothing good)."""

    prompt: int | None
    """Every prompt token, cached ones included."""
    cached: int | None
    """Of those, the ones read from the host's cache."""
    generated: int | None
    prefill_ms: float | None
    tokens_per_second: float | None
    """Generation speed: the host's ``timings``, else measured between content events."""
    bad: int = 0
    """Numbers, events or bodies from the host that were ignored."""


class _Top(msgspec.Struct):
    """An event's data or a whole body; every other key is skipped unbuilt."""

    type: Raw = _UNSET
    choices: Raw = _UNSET
    content: Raw = _UNSET
    usage: Raw = _UNSET
    timings: Raw = _UNSET
    message: Raw = _UNSET
    response: Raw = _UNSET


class _Read(_Top):
    """The same, its ``usage`` and ``timings`` read and checked in the same pass (most
    answers': one decode instead of three); a body with a bad number, or objects not of
    these shapes, is read again as :class:`_Top`, field by field, its bad numbers counted."""

    usage: GoodCounts | msgspec.UnsetType = _UNSET  # type: ignore[assignment]
    timings: GoodTimings | msgspec.UnsetType = _UNSET  # type: ignore[assignment]


_ERRORS = ERRORS
_TOP = msgspec.json.Decoder(_Top)
_READ = msgspec.json.Decoder(_Read)
_CHOICES = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_EMPTY = frozenset({b"", b'""', b"null", b"[]", b"{}"})
_ENDS = {
    "anthropic": frozenset({b"message_stop"}),
    "responses": frozenset({b"response.completed", b"response.incomplete", b"response.failed"}),
}
"""The names of the event that ends a stream, by API (none: it is ``data: [DONE]``)."""
_KEYS = (b'"usage"', b'"timings"')
"""What an event that carries usage holds (the others carry none)."""
_CONTENT = ("content", "reasoning_content", "tool_calls")
"""A chat delta with any of these, not empty, is content (a role alone is not)."""


def _filled(raw: Raw | None) -> bool:
    return raw is not None and raw is not _UNSET and bytes(raw).strip() not in _EMPTY


class AnswerReader:
    """Reads one answer's body for its :class:`TokenUsage`; ``api`` is ``chat``, ``completion``,
    ``anthropic`` or ``responses`` (anything else reads nothing), ``streamed`` whether the
    body is server-sent events. ``now`` gives the times of content events. Numbers past
    ``bounds`` are dropped; ``said`` is told which, in one line (numbers, never a body)."""

    feed: Callable[[bytes], None]
    """Every chunk of the (de-chunked) body, in order, as it is relayed; after a stream's
    first content, a bare ``list.append``."""
    due: float = math.inf
    """Once the bytes relayed in all pass this, the relay calls :meth:`trim`."""

    # What most answers never change is the class's: a reader is made per request.
    first_content: float | None = None
    """When the first content event came: the time to first token, not to the head."""
    last_content: float | None = None  # the end of the content: the stream's end
    first_content_event: int | None = None  # which event (from 0, pings counted) it was
    _skipping = _too_long = _ended = False  # in an event past MAX_EVENT; past MAX_BODY; ended
    _cut = False  # the tail begins inside an event
    _events = 0  # events read
    _body: bytearray | bytes = b""  # a body not streamed: its one chunk as it came, or more
    _done: TokenUsage | None = None
    _streamed_end: frozenset[bytes] | None = None
    _big_end = b""  # a Responses stream's last event's name line

    def __init__(
        self,
        api: str,
        streamed: bool,
        now: Callable[[], float] | None = None,
        bounds: Bounds = _UNBOUNDED,
        said: Callable[[str], object] | None = None,
    ) -> None:
        self._api = api
        self._bounds, self._said = bounds, said
        self._now = now or time.monotonic
        self._tally = Tally()
        self._pending = bytearray()  # the event being read, before the first content
        self._tail: list[bytes] = []  # after the first content: its last chunks, TAIL or more
        if api not in APIS:
            self.feed = _ignore
        elif streamed:
            self._streamed_end = _ENDS.get(api, frozenset())
            if api == "responses":
                self._big_end = b"event: response.completed"
            self.feed = self._read_events
        else:
            self.feed = self._keep_body

    def usage(self) -> TokenUsage:
        """What the answer reported; the reader reads nothing more after this."""
        if self._done is None:
            if self.first_content is not None and self._streamed_end is not None:
                self.last_content = self._now()
            self.feed = _ignore
            self._finish()
            self._done = self._sum()
        return self._done

    def whole(self) -> bool:
        """Whether the stream relayed so far ends with its API's last event (chat's and
        completions' ``[DONE]``, Anthropic's ``message_stop``, Responses' ``completed``,
        ``incomplete`` or ``failed``): a client that leaves then had its whole answer.
        Read from the tail (a Responses stream's last event may outgrow it: see :meth:`trim`)."""
        ends = self._streamed_end
        if ends is None or self._pending.strip(b"\r\n"):
            return False  # not streamed, or an event under way
        if not self._tail:
            return self._ended
        tail = self._joined().replace(b"\r", b"")
        if not tail.endswith(b"\n\n"):
            return False
        if not ends:
            return tail.rstrip(b"\n").rpartition(b"\n")[2].replace(b" ", b"") == b"data:[DONE]"
        return self._ended or any(b"event: " + name + b"\n" in tail for name in ends)

    # Before the first content: every event is read.

    def _read_events(self, data: bytes) -> None:
        if b"\r" in data:
            data = data.replace(b"\r", b"")
        at = 0
        while at < len(data):
            if self._pending[-1:] == b"\n" and data[at : at + 1] == b"\n":
                del self._pending[-1]
                end, after = at, at + 1
            else:
                end = data.find(b"\n\n", at)
                after = end + 2
            if end < 0:
                self._keep_partial(data, at)
                return
            if self._skipping:
                self._skipping = False
            elif len(self._pending) + end - at > MAX_EVENT:
                self._tally.bad += 1
                self._events += 1
            else:
                self._pending += data[at:end]
                self._event(bytes(self._pending))
            self._pending.clear()
            at = after
            if self.first_content is not None:
                self.feed = self._tail.append  # in C: no frame a chunk
                self.due = -1  # the relay trims at once, and counts from there
                if at < len(data):
                    self._tail.append(data[at:])
                return

    def _keep_partial(self, data: bytes, at: int) -> None:
        piece = data[at:]
        if self._skipping:
            self._pending[:] = piece[-1:]
        elif len(self._pending) + len(piece) > MAX_EVENT + 1:
            self._tally.bad += 1
            self._events += 1
            self._skipping = True
            self._pending[:] = piece[-1:]
        else:
            self._pending += piece

    def _event(self, event: bytes) -> None:
        if not event.strip():
            return
        name, data = fields(event)
        if self._streamed_end is not None:
            self._ended = name in self._streamed_end or data.strip() == b"[DONE]"
        number = self._events
        self._events += 1
        top = self._read(data)
        if top is not None and self.first_content is None and self._is_content(name, top):
            self.first_content = self._now()
            self.first_content_event = number

    def _is_content(self, name: bytes, top: _Top) -> bool:
        if self._api in ("anthropic", "responses"):
            kind = name or _string(top.type)
            if self._api == "anthropic":
                return kind == b"content_block_delta"
            return kind.startswith(b"response.") and kind.endswith(b".delta")
        if self._api == "completion" and _filled(top.content):
            return True
        try:
            choices = _CHOICES.decode(top.choices) if top.choices is not _UNSET else []
        except _ERRORS:
            self._tally.bad += 1
            return False
        for choice in choices:
            delta = self._tally.object(choice.get("delta"))
            if any(map(_filled, (choice.get("text"), *map(delta.get, _CONTENT)))):
                return True
        return False

    # After the first content: each chunk appended (itself, not a copy), and trimmed by
    # the relay every TAIL bytes, which counts them anyway.

    def trim(self, sent: int) -> None:
        """The tail's chunks made into its last TAIL bytes (``sent``: the bytes relayed
        so far); a Responses stream's last event's name is looked for first, as that event
        may outgrow the tail (the kept bytes hold the end of the chunks before: a name cut
        in two is found too). The tail holds at most 2 * TAIL bytes and a chunk."""
        joined = self._joined()
        if self._big_end and self._big_end in joined:
            self._ended = True
        if len(joined) > TAIL:
            joined, self._cut = joined[-TAIL:], True
        self._tail[:] = [joined]  # the same list: ``feed`` is its append
        self.due = sent + TAIL

    def _joined(self) -> bytes:
        return b"".join(self._tail)

    def _keep_body(self, data: bytes) -> None:
        body = self._body
        if len(body) + len(data) > MAX_BODY:
            self._too_long = True
            self._body = b""
            self.feed = _ignore
        elif not body:
            self._body = data  # most bodies come in one chunk: kept, not copied
        elif type(body) is bytes:
            self._body = bytearray(body) + data
        else:
            body += data

    # At the end.

    def _finish(self) -> None:
        if self._too_long:
            self._tally.bad += 1
        elif self._body:
            self._read(self._body)
        elif self._pending and not self._skipping:
            self._event(bytes(self._pending).strip(b"\n"))
        elif self._tail:
            self._read_tail()

    def _read_tail(self) -> None:
        joined = self._joined()
        cut = self._cut or len(joined) > TAIL  # the tail begins inside an event
        for start, event in events_with(joined[-TAIL:].replace(b"\r", b""), _KEYS):
            if start or not cut:
                self._read(fields(event)[1])
            else:
                self._read_trailing(event)

    def _read(self, data: bytes | bytearray) -> _Top | None:
        """An event's data, or a body: its usage and timings tallied."""
        if not data or data == b"[DONE]":
            return None
        try:
            top: _Top = _READ.decode(data)
        except msgspec.ValidationError:  # a usage or timings not an object of numbers
            top = None  # type: ignore[assignment]
        except _ERRORS:
            self._tally.bad += 1
            return None
        if top is None:
            try:
                top = _TOP.decode(data)
            except _ERRORS:
                self._tally.bad += 1
                return None
        self._tally.top(top)
        return top

    def _read_trailing(self, cut: bytes) -> None:
        """The end of an event longer than the tail: its last usage and timings objects."""
        for key, found in trailing_objects(cut):
            read = self._tally.counts if key == b"usage" else self._tally.timings
            read(msgspec.Raw(found))

    def _sum(self) -> TokenUsage:
        got = self._tally.fields
        bad = self._tally.bad
        prompt = got.get("prompt_tokens")
        cached = got.get("cached_tokens", got.get("cache_read_input_tokens"))
        if prompt is None and "input_tokens" in got:
            prompt = got["input_tokens"]
            if self._api == "anthropic":
                prompt += got.get("cache_read_input_tokens", 0)
        if prompt is None and "prompt_n" in got and "cache_n" in got:
            prompt = got["prompt_n"] + got["cache_n"]
        if cached is None:
            cached = got.get("cache_n")
        if cached is not None and prompt is not None and cached > prompt:
            bad += 1
            cached = None
        generated = got.get("completion_tokens", got.get("output_tokens", got.get("predicted_n")))
        prompt, cached, generated, dropped = self._bounds.check(
            _int(prompt), _int(cached), _int(generated)
        )
        bad += len(dropped)
        if dropped and self._said is not None:
            self._said("usage dropped as implausible: " + "; ".join(dropped))
        speed = got.get("predicted_per_second")
        if speed is None and generated is not None:
            speed = self._measured(generated)
        # By position (prompt, cached, generated, prefill_ms, tokens_per_second, bad): a
        # third fewer instructions than by keyword, once a request.
        return TokenUsage(prompt, cached, generated, got.get("prompt_ms"), speed, bad)

    def _measured(self, generated: int) -> float | None:
        """Tokens after the first over the time from the first content event to the last
        (the stream's end): the first token's own time is the prefill's, as in
        llama-server's timings."""
        if self.first_content is None or self.last_content is None or generated < 2:
            return None
        seconds = self.last_content - self.first_content
        return (generated - 1) / seconds if seconds > 0 else None


def _ignore(data: bytes) -> None:
    """Reads nothing, for an API without usage or a reader that is done."""


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _string(raw: Raw) -> bytes:
    if raw is _UNSET:
        return b""
    try:
        return msgspec.json.decode(raw, type=str).encode()
    except _ERRORS:
        return b""

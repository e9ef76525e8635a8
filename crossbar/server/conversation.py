"""Which conversation a request belongs to, from its body alone: the key ``cache_affinity``
places it by.

Coding agents resend the whole conversation every turn, and the host that served the
last turn still holds its prefix in its prompt cache. What every turn of one
conversation shares, and other conversations do not, is its start:

- a chat completion: the messages up to and including the first ``user`` message. The
  system prompt alone would not do: one agent's conversations all share it;
- a completion: the first :data:`PROMPT_BYTES` bytes of the prompt;
- plus the model: another model on the same host has a cache of its own.

A chat completion also tells how far its conversation has gone: its *turn* is the number
of ``assistant`` messages in it (each answer a client got comes back in the next turn).
A crossbar that sees turn 5 of a conversation after turn 3 knows another replica
answered turn 4 (:mod:`crossbar.fleet.affinity` places such conversations by a rule every
replica computes alike). A completion has no turns.

The key is a BLAKE2b digest, never Python's ``hash()`` (salted per process): two crossbar
replicas must compute the same key for the same body. Only the role and the content of
each message count, decoded: a client that writes a message again with its keys in
another order, other whitespace or escapes, or with a field added (a cache marker that
some agents put on the newest message only, so on the first user message at turn 1 and
not at turn 2), still gets the same key. Content given as parts counts by the text of
each text part, and by its JSON with sorted keys for any other part.

**A fixed budget.** The body is anyone's, and this runs on the reactor: at most
:data:`MAX_OBJECTS` objects in the messages (an upper bound, counted in C before anything
is built), :data:`MAX_START` messages up to the first user message, :data:`MAX_CONTENT`
bytes and :data:`MAX_PARTS` parts in each of their contents. Past the budget a body has
no conversation (it goes as for ``least_busy``): a real agent's start is far inside it.

Anything unexpected (no messages, no user message, a message that is not an object,
nesting too deep) is "no key", never an error. Pure rules, no I/O.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

import msgspec

from crossbar.fleet.policies import Conversation

PROMPT_BYTES = 4096
"""How much of a completion's prompt identifies its conversation."""
KEY_BYTES = 16
MAX_OBJECTS = 200_000
"""At most this many ``{`` in a body's messages (every message is one; code in a content
has some too): a 16 MiB list of ``{}`` would otherwise be built as millions of messages."""
MAX_START = 64
"""Messages up to and including the first user message."""
MAX_CONTENT = 256 * 1024
"""Bytes of one message's content (as JSON) up to the first user message."""
MAX_PARTS = 256
"""Parts of one message's content up to the first user message."""

_WHITESPACE = b" \t\r\n"


class _Message(msgspec.Struct, gc=False):
    role: str = ""
    content: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """A view into the body, decoded only up to the first user message."""


_MESSAGES = msgspec.json.Decoder(list[_Message])
_PARTS = msgspec.json.Decoder(list[msgspec.Raw])
ERRORS = (msgspec.MsgspecError, RecursionError, UnicodeError, ValueError)


class _OverBudget(Exception):
    pass


def chat_conversation(model: str | None, messages: msgspec.Raw) -> Conversation | None:
    """A chat completion's conversation, from its ``messages`` (their JSON)."""
    if bytes(memoryview(messages)[:1]) != b"[":
        return None
    if len(messages) > MAX_OBJECTS and bytes(messages).count(b"{") > MAX_OBJECTS:
        return None
    try:
        listed = _MESSAGES.decode(messages)
        digest = _digest(model, b"chat")
        for at, message in enumerate(listed[:MAX_START]):
            _field(digest, message.role.encode())
            content = message.content
            _field(digest, b"" if content is msgspec.UNSET else _content(content))
            if message.role == "user":
                turn = sum(later.role == "assistant" for later in listed[at + 1 :])
                return Conversation(digest.digest(), turn)
    except (*ERRORS, _OverBudget):
        return None
    return None


def completion_conversation(model: str | None, prompt: msgspec.Raw) -> Conversation | None:
    """A completion's conversation, from its ``prompt`` (its JSON); it has no turns."""
    raw = bytes(prompt)
    digest = _digest(model, b"completion")
    if raw.startswith(b'"'):
        try:
            text = msgspec.json.decode(raw, type=str)
        except ERRORS:
            return None
        _field(digest, text.encode("utf-8", "surrogatepass")[:PROMPT_BYTES])
    else:  # token ids (or a list of prompts): as written, less any whitespace
        _field(digest, raw.translate(None, _WHITESPACE)[:PROMPT_BYTES])
    return Conversation(digest.digest(), None)


def _digest(model: str | None, kind: bytes) -> Any:
    digest = blake2b(digest_size=KEY_BYTES)
    _field(digest, (model or "").encode())
    _field(digest, kind)
    return digest


def _field(digest: Any, data: bytes) -> None:
    """Length first: no two different lists of fields hash as the same bytes."""
    digest.update(len(data).to_bytes(8, "big"))
    digest.update(data)


def _content(raw: msgspec.Raw) -> bytes:
    """A message's content as text: the same whatever the JSON around it looked like."""
    if len(raw) > MAX_CONTENT:
        raise _OverBudget
    if bytes(memoryview(raw)[:1]) != b"[":
        value = msgspec.json.decode(raw)
        if isinstance(value, str):
            return value.encode("utf-8", "surrogatepass")
        return msgspec.json.encode(value, order="sorted")
    listed = _PARTS.decode(raw)
    if len(listed) > MAX_PARTS:
        raise _OverBudget
    parts: list[bytes] = []
    for one in listed:
        part = msgspec.json.decode(one)
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and part.get("type", "text") == "text":
            data = b"t" + text.encode("utf-8", "surrogatepass")
        else:
            data = b"j" + msgspec.json.encode(part, order="sorted")
        parts += (len(data).to_bytes(8, "big"), data)
    return b"".join(parts)

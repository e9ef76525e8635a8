"""Which conversation a request belongs to, from its body alone: the key ``cache_affinity``
places it by.

Coding agents resend the whole conversation every turn, and the host that served the
last turn still holds its prefix in its prompt cache. What every turn of one
conversation shares, and other conversations do not, is its start:

- a chat completion (``/v1/chat/completions``): the messages up to and including the
  first ``user`` message. The system prompt alone would not do: one agent's
  conversations all share it;
- a completion (``/v1/completions``): the first :data:`PROMPT_BYTES` bytes of the prompt;
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

As with :mod:`crossbar.server.peek`, msgspec reads the body without building it: of each
message only its role is built, its content stays a view into the body, decoded only up
to the first user message. Anything unexpected (not JSON, no messages, no user message,
a message that is not an object, nesting too deep) is "no key", never an error. Pure
rules, no I/O.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

import attrs
import msgspec

PROMPT_BYTES = 4096
"""How much of a completion's prompt identifies its conversation."""
KEY_BYTES = 16

_CHAT = b"/v1/chat/completions"
_COMPLETIONS = b"/v1/completions"
_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\r\n"


class _Message(msgspec.Struct):
    role: str = ""
    content: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Chat(msgspec.Struct):
    messages: list[_Message] | msgspec.UnsetType = msgspec.UNSET
    """Each message's role; its content a view into the body, decoded only up to the
    first user message."""


@attrs.frozen
class Conversation:
    """The conversation a request continues."""

    key: bytes
    turn: int | None
    """The ``assistant`` messages of a chat completion (0 on its first turn); ``None``
    for a completion."""


class _Completion(msgspec.Struct):
    prompt: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_CHAT_DECODER = msgspec.json.Decoder(_Chat)
_COMPLETION_DECODER = msgspec.json.Decoder(_Completion)
_ERRORS = (msgspec.MsgspecError, RecursionError, UnicodeError, ValueError)


def read_conversation(path: bytes, body: bytes, model: str | None) -> Conversation | None:
    """The conversation a request continues, or ``None`` when it has none.

    ``path`` is the route's part of the request path (``/v1/chat/completions``);
    ``model`` the model the request is for (the route's default filled in).
    """
    if path != _CHAT and path != _COMPLETIONS:
        return None
    view = memoryview(body)
    if body.startswith(_BOM):
        view = view[len(_BOM) :]
    digest = blake2b(digest_size=KEY_BYTES)
    _field(digest, (model or "").encode())
    turn: int | None = None
    try:
        if path == _CHAT:
            turn = _chat(digest, view)
            if turn is None:
                return None
        elif not _prompt(digest, view):
            return None
    except _ERRORS:
        return None
    return Conversation(digest.digest(), turn)


def _field(digest: Any, data: bytes) -> None:
    """Length first: no two different lists of fields hash as the same bytes."""
    digest.update(len(data).to_bytes(8, "big"))
    digest.update(data)


def _chat(digest: Any, view: memoryview) -> int | None:
    """Hashes the conversation's start; its turn, or ``None`` when it has no start."""
    messages = _CHAT_DECODER.decode(view).messages
    if messages is msgspec.UNSET:
        return None
    _field(digest, b"chat")
    for at, message in enumerate(messages):
        _field(digest, message.role.encode())
        content = message.content
        _field(digest, b"" if content is msgspec.UNSET else _content(content))
        if message.role == "user":
            return sum(later.role == "assistant" for later in messages[at + 1 :])
    return None


def _content(raw: msgspec.Raw) -> bytes:
    """A message's content as text: the same whatever the JSON around it looked like."""
    value = msgspec.json.decode(raw)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if not isinstance(value, list):
        return msgspec.json.encode(value, order="sorted")
    parts: list[bytes] = []
    for part in value:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and part.get("type", "text") == "text":
            data = b"t" + text.encode("utf-8", "surrogatepass")
        else:
            data = b"j" + msgspec.json.encode(part, order="sorted")
        parts += (len(data).to_bytes(8, "big"), data)
    return b"".join(parts)


def _prompt(digest: Any, view: memoryview) -> bool:
    """Hashes the prompt's start; ``True`` when there is one."""
    prompt = _COMPLETION_DECODER.decode(view).prompt
    if prompt is msgspec.UNSET:
        return False
    _field(digest, b"completion")
    raw = bytes(prompt)
    if raw.startswith(b'"'):
        text = msgspec.json.decode(raw, type=str)
        _field(digest, text.encode("utf-8", "surrogatepass")[:PROMPT_BYTES])
    else:  # token ids (or a list of prompts): as written, less any whitespace
        _field(digest, raw.translate(None, _WHITESPACE)[:PROMPT_BYTES])
    return True

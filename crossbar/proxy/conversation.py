"""Which conversation a request belongs to, from its body alone: the key ``cache_affinity``
places it by.

Coding agents resend the whole conversation every turn, and the host that served the
last turn still holds its prefix in its prompt cache. What every turn of one
conversation shares, and other conversations do not, is its start:

- a chat completion: the messages up to and including the first ``user`` message. The
  system prompt alone would not do: one agent's conversations all share it;
- an Anthropic Messages request (Claude Code): its ``system`` and its messages up to the
  first user message. Claude Code's billing header (``x-anthropic-billing-header: ...``,
  with a nonce per request in some versions) never counts: every turn of a session has
  one key, as llama-server's prompt cache has one prefix;
- a Responses request (Codex): its ``instructions`` and its input items up to the first
  user item that is the person's own. Codex sends its context first, as user items
  (:data:`CONTEXT_MARKERS`: the directory's AGENTS.md, its ``<environment_context>``),
  the same for every session started in one directory: the key reads on past them, else
  all of a checkout's sessions would be one conversation on one host;
- a completion: the first :data:`PROMPT_BYTES` bytes of the prompt;
- plus the model: another model on the same host has a cache of its own.

Read in the same pass, a second digest, the conversation's *prefix*: what every new
conversation of one agent shares (the model, the system prompt or instructions, the
messages before the first user message, and the tools), with no user message in it.
:mod:`crossbar.prefixes` counts them, and keeps a popular one saved on each host.

A conversation also tells how far it has gone: its *turn* is the number of answers sent
back in it (``assistant`` messages; in a Responses input, each run of the model's output
items between two inputs).
A crossbar that sees turn 5 of a conversation after turn 3 knows another replica
answered turn 4 (:mod:`crossbar.routing.affinity` places such conversations by a rule every
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

import re
from hashlib import blake2b
from typing import Any

import msgspec

from crossbar.routing.conversationtable import KEY_BYTES
from crossbar.routing.policies import Conversation

PROMPT_BYTES = 4096
"""How much of a completion's prompt identifies its conversation."""
MAX_OBJECTS = 200_000
"""At most this many ``{`` in a body's messages (every message is one; code in a content
has some too): a 16 MiB list of ``{}`` would otherwise be built as millions of messages."""
MAX_START = 64
"""Messages up to and including the first user message (in a Responses input: the first
that is not only Codex's context)."""
MAX_CONTENT = 256 * 1024
"""Bytes of one message's content (as JSON) up to the first user message."""
MAX_PARTS = 256
"""Parts of one message's content up to the first user message."""

_WHITESPACE = b" \t\r\n"


class _Message(msgspec.Struct, gc=False):
    role: str = ""
    content: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """A view into the body, decoded only up to the first user message."""


class _Item(msgspec.Struct, gc=False):
    """A Responses API input item: a message (``role``), or a function call, its output,
    reasoning... (``type``)."""

    type: str = ""
    role: str = ""
    content: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_MESSAGES = msgspec.json.Decoder(list[_Message])
_ITEMS = msgspec.json.Decoder(list[_Item])
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_OUTPUT_ITEMS = frozenset({"function_call", "reasoning", "custom_tool_call", "local_shell_call"})
"""Input items that are the model's own output, sent back (besides assistant messages)."""
CONTEXT_MARKERS = (b"<environment_context>", b"# AGENTS.md instructions", b"<user_instructions>")
"""How the user items Codex writes itself begin: the AGENTS.md in force (in older versions
inside ``<user_instructions>``), the working directory, shell and date. A user item each
text of which begins so is context, not the person's prompt: it is hashed, and the key
reads on to the next user item. Codex 0.169 sends both in one item, after its developer
messages and before the prompt (tests/fixtures/codex-0.169-sessions.json). Without this,
every session started in one directory would have one key: one host for a whole lab."""
_BILLING = re.compile(r"x-anthropic-billing-header:(?:\s*[A-Za-z0-9_.-]+=[^;\n]*;)*\s*")
"""Claude Code's billing header, at the start of its system prompt: fields such as
``cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;``, the last a nonce."""
_PARTS = msgspec.json.Decoder(list[msgspec.Raw])
ERRORS = (msgspec.MsgspecError, RecursionError, UnicodeError, ValueError)


class _OverBudget(Exception):
    pass


class _Digests:
    """The key's digest and the prefix's, fed together up to the first user message."""

    def __init__(self, model: str | None, kind: bytes) -> None:
        self.key, self.prefix = _digest(model, kind), _digest(model, kind)
        self.shared = True

    def update(self, data: bytes) -> None:
        self.key.update(data)
        if self.shared:
            self.prefix.update(data)

    def conversation(self, turn: int | None, tools: msgspec.Raw | None) -> Conversation:
        """The conversation, its prefix ending with the tools (as written, less whitespace)."""
        _field(self.prefix, b"" if tools is None else bytes(tools).translate(None, _WHITESPACE))
        return Conversation(self.key.digest(), turn, self.prefix.digest())


def chat_conversation(
    model: str | None, messages: msgspec.Raw, tools: msgspec.Raw | None = None
) -> Conversation | None:
    """A chat completion's conversation, from its ``messages`` (their JSON) and ``tools``."""
    return _messages(_Digests(model, b"chat"), messages, tools)


def anthropic_conversation(
    model: str | None,
    system: msgspec.Raw | None,
    messages: msgspec.Raw,
    tools: msgspec.Raw | None = None,
) -> Conversation | None:
    """A Messages API request's conversation: its ``system`` (a string or text blocks,
    Claude Code's billing header left out) and its messages up to the first user one."""
    digest = _Digests(model, b"anthropic")
    try:
        _field(digest, b"" if system is None else _system(system))
    except (*ERRORS, _OverBudget):
        return None
    return _messages(digest, messages, tools)


def _messages(
    digest: _Digests, messages: msgspec.Raw, tools: msgspec.Raw | None
) -> Conversation | None:
    """The conversation of ``messages`` up to the first user one, its turn the assistant
    messages after it; ``digest`` holds what came before (the model, the system)."""
    try:
        listed = _listed(messages, _MESSAGES)
        at = None if listed is None else _start(digest, listed)
    except (*ERRORS, _OverBudget):
        return None
    if at is None:
        return None
    turn = sum(later.role == "assistant" for later in listed[at + 1 :])
    return digest.conversation(turn, tools)


def responses_conversation(
    model: str | None,
    instructions: msgspec.Raw | None,
    given: msgspec.Raw,
    tools: msgspec.Raw | None = None,
) -> Conversation | None:
    """A Responses API request's conversation: its ``instructions`` and its input items
    up to the first user one that is not only Codex's context (:data:`CONTEXT_MARKERS`;
    an input that is a string is that one). Its turn is the model's answers since: each
    run of output items (a message, function calls, reasoning) between two inputs."""
    try:
        digest = _Digests(model, b"responses")
        _field(digest, b"" if instructions is None else _content(instructions))
        if bytes(memoryview(given)[:1]) == b'"':
            digest.shared = False
            _field(digest, b"user")
            _field(digest, _content(given))
            return digest.conversation(0, tools)
        listed = _listed(given, _ITEMS)
        if listed is None:
            return None
        at = _start(digest, listed, CONTEXT_MARKERS)
    except (*ERRORS, _OverBudget):
        return None
    if at is None:
        return None
    turn, answering = 0, False
    for item in listed[at + 1 :]:
        output = item.role == "assistant" or item.type in _OUTPUT_ITEMS
        turn += output and not answering
        answering = output
    return digest.conversation(turn, tools)


def _listed(raw: msgspec.Raw, decoder: msgspec.json.Decoder[Any]) -> Any:
    """``raw`` (a JSON array) decoded, within the budget's objects; ``None`` otherwise."""
    if bytes(memoryview(raw)[:1]) != b"[":
        return None
    if len(raw) > MAX_OBJECTS and bytes(raw).count(b"{") > MAX_OBJECTS:
        return None
    return decoder.decode(raw)


def _start(digest: _Digests, listed: Any, context: tuple[bytes, ...] = ()) -> int | None:
    """Hashes the messages (or items) up to the first user one whose texts do not all
    begin with one of ``context``'s markers; its index, if any. The prefix's digest takes
    those before the first user message of any kind."""
    for at, message in enumerate(listed[:MAX_START]):
        digest.shared = digest.shared and message.role != "user"
        _field(digest, message.role.encode())
        content = message.content
        data = b"" if content is msgspec.UNSET else _content(content)
        _field(digest, data)
        if message.role == "user" and not (context and _marked(content, data, context)):
            return at  # type: ignore[no-any-return]
    return None


def _marked(content: Any, data: bytes, markers: tuple[bytes, ...]) -> bool:
    """Whether every text of a content (as :func:`_content` gave it: ``data``) begins
    with one of ``markers``, and it has no other part."""
    if content is msgspec.UNSET or not data:
        return False
    if bytes(memoryview(content)[:1]) != b"[":
        return data.startswith(markers)
    at = 0
    while at < len(data):  # the parts as _parts() wrote them: length, "t", text
        if data[at + 8 : at + 9] != b"t" or not data.startswith(markers, at + 9):
            return False
        at += 8 + int.from_bytes(data[at : at + 8], "big")
    return True


def _system(raw: msgspec.Raw) -> bytes:
    """A Messages API ``system`` as text, without Claude Code's billing header: it
    carries a nonce in some versions (``cch=``), which would make every turn of a
    session a conversation of its own (llama-server rewrites it before the prompt)."""
    if len(raw) > MAX_CONTENT:
        raise _OverBudget
    value = msgspec.json.decode(raw)
    if isinstance(value, str):
        return _BILLING.sub("", value, count=1).encode("utf-8", "surrogatepass")
    if not isinstance(value, list):
        return msgspec.json.encode(value, order="sorted")
    if len(value) > MAX_PARTS:
        raise _OverBudget
    parts = []
    for block in value:
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str):
            text = _BILLING.sub("", text, count=1)
            if text:
                parts.append({"type": "text", "text": text})
        else:
            parts.append(block)
    return _parts(parts)


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
    return _parts([msgspec.json.decode(one) for one in listed])


def _parts(parts: list[Any]) -> bytes:
    """Content given as parts: each text part by its text, any other by its JSON with
    sorted keys (the same whatever order a client writes its keys in)."""
    out: list[bytes] = []
    for part in parts:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and part.get("type", "text") in _TEXT_PARTS:
            data = b"t" + text.encode("utf-8", "surrogatepass")
        else:
            data = b"j" + msgspec.json.encode(part, order="sorted")
        out += (len(data).to_bytes(8, "big"), data)
    return b"".join(out)

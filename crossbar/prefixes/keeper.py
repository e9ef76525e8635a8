"""Saving a slot that holds a popular shared prefix on a host, and restoring it into a free
slot there before a new conversation's first turn.

llama-server's slots share no KV: each new conversation of an agent prefills the agent's
system prompt and tools again, in an empty slot. A host started with ``--slot-save-path``
can save a slot to a file and restore it into another slot in milliseconds; a new
conversation then takes the restored slot by the host's own prompt-similarity choice and
prefills only its own tokens.

- After a turn of a popular prefix ended on a host that holds it saved in no file yet
  (:meth:`PrefixKeeper.finished`: a first turn, or any later one while the save is missing),
  the host's slot used last is saved (``GET /slots``: the highest ``id_task``, an idle one
  first), once per model and build (``/props`` ``build_info``). A later turn counts: the
  first conversation on a host often ends its first turn before a second one began anywhere,
  and a client's next turn often reaches the host before the save does. A busy slot is
  saved all the same: llama-server holds the save until the slot's turn ends.
- Before a new conversation's first turn (:meth:`PrefixKeeper.before`), a prefix saved on
  its host is restored into the highest slot that has never held a prompt: never into one
  that holds a live conversation's cache; when none is free, nothing is added on the turn's
  way. The highest, so that the host's prompt-similarity choice, which takes the lowest of
  equally similar idle slots, gives the new conversation the restored slot rather than the
  idle slot of a live conversation that shares the same prefix.

Through a router the ``POST /slots/N?action=...`` asks carry the model in the body (this
build's router reads a POST's model from its body, and answers ``400 model name is missing``
to ``?model=``); ``GET /slots`` and ``/props`` carry it as ``?model=``. A failure costs the
request nothing but a log line, and backs off for that host (:mod:`crossbar.prefixes.saves`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

import msgspec
import treq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as NoAnswer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.prefixes.counts import PrefixCounts
from crossbar.prefixes.saves import Key, PrefixSaves
from crossbar.routing import Conversation

log = Logger()

MIN_TOKENS = 64
"""A saved prefix shorter than this is never restored: too short to gain from."""
TIMEOUT = 2.0
"""Seconds a restore may hold a turn (it takes milliseconds): past them the turn goes."""
SAVE_TIMEOUT = 600.0
"""Seconds a save may take, waiting for its busy slot's turn to end on the host."""


class HTTPClient(Protocol):
    """The part of treq's ``HTTPClient`` (or ``StubTreq``) the keeper uses."""

    def get(self, url: str, /, *, headers: Any = ...) -> Deferred[Any]: ...

    def post(self, url: str, /, *, data: Any = ..., headers: Any = ...) -> Deferred[Any]: ...


class _Slot(msgspec.Struct, gc=False):
    id: int
    is_processing: bool = False
    id_task: int | None = None
    n_prompt_tokens: int = 0


_SLOTS = msgspec.json.Decoder(list[_Slot])


class _Answer(msgspec.Struct, gc=False):
    n_saved: int = 0
    n_restored: int = 0


class _Props(msgspec.Struct, gc=False):
    build_info: str = ""
    media_marker: str = ""
    """Random, new at every start of the model's server: tells a reload."""


class _Failed(Exception):
    """A save or restore that did not happen; its words say why."""


class _Refused(_Failed):
    """The host has no ``--slot-save-path``."""


class PrefixKeeper:
    """Saves popular shared prefixes on hosts, and restores them before new conversations."""

    def __init__(
        self,
        client: HTTPClient,
        urls: Mapping[str, str],
        clock: IReactorTime,
        saves: PrefixSaves,
        counts: PrefixCounts | None = None,
        headers: Mapping[str, Mapping[bytes, list[bytes]]] | None = None,
    ) -> None:
        self._client, self._urls, self._clock = client, urls, clock
        self.saves, self.counts = saves, counts or PrefixCounts()
        self._headers = headers or {}
        self._saving: set[tuple[str, str, bytes]] = set()
        """Saves asked and not answered yet: host, model, prefix."""

    def before(
        self, route: str, model: str | None, host: str, conversation: Conversation | None
    ) -> Deferred[None] | None:
        """Before a turn is sent to ``host``: for a new conversation whose prefix is saved
        there, the restore (it never fails); ``None``: the turn goes at once."""
        if conversation is None or conversation.prefix is None or model is None:
            return None
        if conversation.turn != 0:
            return None
        now = self._clock.seconds()
        self.counts.saw(route, model, conversation.prefix, now)
        if not self.saves.may_ask(host, now) or not self.saves.holds(
            host, model, conversation.prefix
        ):
            return None
        return Deferred.fromCoroutine(
            self._guarded(host, model, conversation.prefix, True, TIMEOUT)
        )

    def finished(
        self, route: str, model: str | None, host: str, conversation: Conversation | None, ok: bool
    ) -> Deferred[None] | None:
        """A turn on ``host`` ended (``ok``: answered whole): a popular prefix has its slot
        saved there, after a first turn (unless saved for this build and start already) or
        after a later one while no file holds it there."""
        if not ok or conversation is None or conversation.prefix is None or model is None:
            return None
        now, prefix = self._clock.seconds(), conversation.prefix
        if conversation.turn is None or not self.saves.may_ask(host, now):
            return None
        if conversation.turn > 0 and self.saves.holds(host, model, prefix):
            return None
        if (host, model, prefix) in self._saving or not self.counts.popular(
            route, model, prefix, now
        ):
            return None
        self._saving.add((host, model, prefix))
        saving = Deferred.fromCoroutine(self._guarded(host, model, prefix, False, SAVE_TIMEOUT))
        return saving.addBoth(lambda _: self._saving.discard((host, model, prefix)))

    async def _guarded(
        self, host: str, model: str, prefix: bytes, restore: bool, timeout: float
    ) -> None:
        what = "restore" if restore else "save"
        asked = self._restore(host, model, prefix) if restore else self._save(host, model, prefix)
        try:
            await Deferred.fromCoroutine(asked).addTimeout(timeout, self._clock)
        except _Refused:
            self.saves.refused(host, self._clock.seconds())
            log.info("host {host} keeps no saved slots (no --slot-save-path)", host=host)
        except Exception as e:
            if isinstance(e, (CancelledError, NoAnswer)):
                e = _Failed(f"no answer within {timeout:g}s")
            wait = self.saves.failed(host, self._clock.seconds())
            log.warn(
                "prefix {what} of model {model} on host {host} failed: {why}; not tried"
                " there for {wait:g}s",
                what=what, model=model, host=host, why=str(e) or type(e).__name__, wait=wait,
            )  # fmt: skip

    async def _restore(self, host: str, model: str, prefix: bytes) -> None:
        key = await self._key(host, model, prefix)
        saved = None if key is None else self.saves.find(host, key)
        if saved is None or saved.tokens < MIN_TOKENS:
            return
        free = [s for s in await self._slots(host, model) if _never_used(s)]
        if not free:
            return  # every slot holds a prompt: nothing is restored over one
        # The highest: the host gives a new prompt the slot sharing most of it, the lowest of
        # equals, and an unmatched one the last never-used slot; so each used slot has a
        # higher id than this one, and an idle live conversation's slot, sharing as much of
        # the new prompt (the prefix), loses the tie to it rather than being taken.
        await self._action(host, model, free[-1].id, "restore", saved.name)
        self.saves.restored(host)

    async def _save(self, host: str, model: str, prefix: bytes) -> None:
        key = await self._key(host, model, prefix)
        if key is None or self.saves.find(host, key) is not None:
            return
        used = [s for s in await self._slots(host, model) if s.n_prompt_tokens]
        if not used:
            return
        last = max(used, key=lambda s: (not s.is_processing, s.id_task or 0))
        name = self.saves.name_for(host, key)
        answer = await self._action(host, model, last.id, "save", name)
        self.saves.saved(host, key, name, answer.n_saved)

    async def _key(self, host: str, model: str, prefix: bytes) -> Key | None:
        """The saved prefix's key: the model, its server's build and start (``/props``
        ``build_info`` and ``media_marker``, random at each load), the digest; ``None``
        while the model is not loaded (a router answers ``400``, loading nothing)."""
        code, body = await self._get(host, f"/props?model={quote(model, safe='')}&autoload=false")
        if code == 400:
            return None
        if code != 200:
            raise _Failed(f"/props answered {code}")
        props = msgspec.json.decode(body, type=_Props)
        return (model, f"{props.build_info} {props.media_marker}", prefix)

    async def _slots(self, host: str, model: str) -> list[_Slot]:
        code, body = await self._get(host, f"/slots?model={quote(model, safe='')}")
        if code != 200:
            raise _Failed(f"/slots answered {code}")
        return _SLOTS.decode(body)

    async def _get(self, host: str, path: str) -> tuple[int, bytes]:
        response = await self._client.get(self._urls[host] + path, headers=self._headers.get(host))
        return response.code, await treq.content(response)

    async def _action(self, host: str, model: str, slot: int, action: str, name: str) -> _Answer:
        url = f"{self._urls[host]}/slots/{slot}?action={action}"
        data = msgspec.json.encode({"filename": name, "model": model})
        headers = {b"Content-Type": [b"application/json"], **self._headers.get(host, {})}
        response = await self._client.post(url, data=data, headers=headers)
        body = await treq.content(response)
        if response.code == 501:
            raise _Refused
        if response.code != 200:
            raise _Failed(f"{action} answered {response.code}")
        return msgspec.json.decode(body, type=_Answer)


def _never_used(slot: _Slot) -> bool:
    """A slot that holds no prompt: idle, and never given a task (or one of no tokens)."""
    return not slot.is_processing and (slot.id_task is None or slot.n_prompt_tokens == 0)

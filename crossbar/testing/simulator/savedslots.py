"""Saved slots, as a llama-server started with ``--slot-save-path`` keeps them.

``POST /slots/N?action=save {"filename": F}`` writes slot N's tokens under F;
``action=restore`` puts them into slot N. A save of a busy slot is answered once its
request ends, with what the slot holds then, as llama-server defers it. The files are the
host's, shared by every model server (in router mode each loaded model's server gets the
same folder), and belong to the model that wrote them: another model's file is refused, as
llama-server refuses a file its KV cannot take. A host started without a save path answers
``501``; a name with a path in it ``400 Invalid filename``. Through a router the model is
read from the body.
"""

from __future__ import annotations

import re
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.server import Request

from crossbar.testing.simulator import serving
from crossbar.testing.simulator.cache import PromptCache, Tokens
from crossbar.testing.simulator.replies import SLOTS, HttpError

NO_SAVE_PATH = "This server does not support slots action. Start it with `--slot-save-path`"
BAD_FILE = "Unable to restore slot: No available space in KV cache or invalid slot save file"
_NAME = re.compile(r"[\w.-]+")


class SlotFiles:
    """One host's saved slot files: name -> (model, tokens)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, Tokens]] = {}
        self.enabled = False
        """``--slot-save-path`` given; off by default, as on llama-server."""

    async def act(self, cache: PromptCache, request: Request, body: dict[str, Any]) -> None:
        """``POST /slots/N?action=...`` on ``cache``'s slot N, answered (a save once the
        slot is idle)."""
        slot, action = request.path.decode().rsplit("/", 1)[1], serving.query(request, "action")
        if (
            self.enabled
            and action == "save"
            and slot.isdigit()
            and int(slot) < len(cache.listing())
        ):
            idle: Deferred[None] = Deferred()
            cache.when_idle(int(slot), lambda: idle.callback(None))
            await idle
            if request.finished or request._disconnected:  # the asker left meanwhile
                return
        serving.send(request, 200, self._answer(cache, slot, action, body))

    def _answer(self, cache: PromptCache, slot: str, action: str, body: dict[str, Any]) -> bytes:
        if not self.enabled:
            raise HttpError(501, NO_SAVE_PATH, "not_supported_error")
        name = body.get("filename")
        if not slot.isdigit() or int(slot) >= len(cache.listing()):
            raise HttpError(400, "Invalid slot ID")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
            raise HttpError(400, "Invalid filename")
        at = int(slot)
        if action == "save":
            tokens = cache.held(at)
            self.files[name] = (cache.model, tokens)
            return b'{"id_slot":%d,"filename":"%s","n_saved":%d}' % (at, name.encode(), len(tokens))
        if action == "restore":
            model, tokens = self.files.get(name, ("", ()))
            if model != cache.model or not cache.restore(at, tokens):
                raise HttpError(400, BAD_FILE)
            return b'{"id_slot":%d,"filename":"%s","n_restored":%d}' % (
                at,
                name.encode(),
                len(tokens),
            )
        raise HttpError(400, "Invalid action")


def slots_listing(cache: PromptCache | None) -> list[dict[str, object]]:
    """``GET /slots`` of a model server (``None``: before its first request)."""
    return SLOTS if cache is None else cache.listing()

"""Which shared prefixes are saved on each host, and which hosts allow saves at all.

Learned, not configured: a host is asked once, and remembered. One started without
``--slot-save-path`` answers ``501`` ("This server does not support slots action"): it is
not asked again for :data:`REFUSED_AGAIN` seconds (it may be restarted with it). Any
other failure backs off for that host, doubling from :data:`BACK_OFF` up to
:data:`BACK_OFF_MOST`. A saved prefix belongs to a model and the host's build: looked up
under both, so after a build change it is saved again, never restored wrongly; a model
reloaded forgets its host's prefixes (:meth:`PrefixSaves.forget`).

File names are crossbar's own, never a client's text: ``crossbar-prefix-N.bin`` with N
below the host's ``prefix_files``; a new prefix past the bound takes the name (and so the
file on disk) of the one used least recently. So the disk used on a host is bounded by a
count. Pure data, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import attrs

BACK_OFF = 30.0
BACK_OFF_MOST = 1800.0
REFUSED_AGAIN = 3600.0

Key = tuple[str, str, bytes]
"""A saved prefix's model, build and digest."""


@attrs.frozen
class Saved:
    """One prefix saved on a host: its file there and its tokens."""

    name: str
    tokens: int


@attrs.define
class _Host:
    allows: bool | None = None
    """``None``: not asked yet."""
    retry_at: float = 0.0
    failures: int = 0
    restores: int = 0
    files: OrderedDict[Key, Saved] = attrs.Factory(OrderedDict)


class PrefixSaves:
    """What each host holds saved, bounded by ``files_of(host)`` files a host."""

    def __init__(self, files_of: Callable[[str], int]) -> None:
        self._files_of = files_of
        self._hosts: dict[str, _Host] = {}

    def may_ask(self, host: str, now: float) -> bool:
        """Whether a save or restore may be asked of ``host`` now (not backing off)."""
        known = self._hosts.get(host)
        return known is None or known.retry_at <= now

    def allows(self, host: str) -> bool | None:
        known = self._hosts.get(host)
        return None if known is None else known.allows

    def refused(self, host: str, now: float) -> None:
        """``host`` has no ``--slot-save-path``: not asked again for a long while."""
        known = self._host(host)
        known.allows, known.retry_at, known.files = False, now + REFUSED_AGAIN, OrderedDict()

    def failed(self, host: str, now: float) -> float:
        """A save or restore failed on ``host``: backed off; how long, in seconds."""
        known = self._host(host)
        wait: float = min(BACK_OFF * 2**known.failures, BACK_OFF_MOST)
        known.failures, known.retry_at = known.failures + 1, now + wait
        return wait

    def find(self, host: str, key: Key) -> Saved | None:
        """The file holding ``key`` on ``host``, if saved (and it counts as used now)."""
        known = self._hosts.get(host)
        saved = None if known is None else known.files.get(key)
        if saved is not None and known is not None:
            known.files.move_to_end(key)
        return saved

    def holds(self, host: str, model: str, prefix: bytes) -> bool:
        """Whether ``host`` holds ``prefix`` of ``model`` saved, of any build."""
        known = self._hosts.get(host)
        return known is not None and any(k[0] == model and k[2] == prefix for k in known.files)

    def name_for(self, host: str, key: Key) -> str:
        """The file name ``key`` is to be saved under on ``host``: its own, a free one, or
        that of the prefix used least recently (forgotten now)."""
        files = self._host(host).files
        if key in files:
            return files[key].name
        taken = {saved.name for saved in files.values()}
        for n in range(max(1, self._files_of(host))):
            if f"crossbar-prefix-{n}.bin" not in taken:
                return f"crossbar-prefix-{n}.bin"
        return files.popitem(last=False)[1].name

    def saved(self, host: str, key: Key, name: str, tokens: int) -> None:
        """``host`` saved ``key`` under ``name``: it allows saves, and its back-off ends."""
        known = self._host(host)
        for other in [k for k, s in known.files.items() if s.name == name]:
            del known.files[other]
        known.files[key] = Saved(name, tokens)
        known.allows, known.failures, known.retry_at = True, 0, 0.0

    def restored(self, host: str) -> None:
        """A saved prefix was restored into a slot of ``host`` (counted)."""
        known = self._host(host)
        known.allows, known.failures, known.retry_at = True, 0, 0.0
        known.restores += 1

    def forget(self, host: str, model: str) -> None:
        """``model`` was reloaded on ``host``: its saved prefixes are saved again."""
        known = self._hosts.get(host)
        if known is not None:
            for key in [k for k in known.files if k[0] == model]:
                del known.files[key]

    def listing(self) -> list[dict[str, object]]:
        """Each host's state, for the status page."""
        return [
            {
                "host": host,
                "allows_saves": known.allows,
                "restores": known.restores,
                "saved": [
                    {"model": key[0], "prefix": key[2].hex()[:12], "tokens": saved.tokens}
                    for key, saved in known.files.items()
                ],
            }
            for host, known in sorted(self._hosts.items())
        ]

    def _host(self, host: str) -> _Host:
        return self._hosts.setdefault(host, _Host())

"""One request as it ended, proxied or refused at the door: the one record its observers
(the metrics, the recent window, the access log) read, each the fields it needs, by name.

Adding what a request tells (a field of the JSON log, a metric) is a field here and the
observer that reads it; nothing is passed by position or parsed back out of text.
Pure values, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from crossbar.polling.modellist import NO_MODEL as NO_MODEL  # the names stats and usage show
from crossbar.polling.modellist import OTHER_MODEL as OTHER_MODEL
from crossbar.routing.affinity import AffinityOutcome


@attrs.frozen
class RequestRecord:
    """One request, as it ended."""

    route: str
    """The route's name, or ``-`` when the path named none that exists."""
    host: str | None
    """The last host tried; ``None`` when no host was (bad path, no healthy host)."""
    status: int
    """The status sent to the client; 499 when the client left before the end of its answer."""
    seconds: float
    first_byte: float | None = None
    """Seconds until the host's status line, if one came."""
    sent: int = 0
    """Bytes of the host's answer body relayed to the client."""
    model: str | None = None
    """The model the request's body asked for (or the route's default filled into it);
    ``None`` for a request that asks for no model. As the client wrote it: observers
    that show it check it against the models hosts list."""
    affinity: AffinityOutcome | None = None
    """How ``cache_affinity`` placed the request's conversation; ``None`` for a request
    with no conversation or on a route of another policy."""
    method: bytes | None = None
    """As the client sent it (unchecked bytes: observers that show it make it printable)."""
    path: bytes = b"-"
    """The route's part of the path once a route is known, else the path as asked."""
    tried: tuple[str, ...] = ()
    """Every host tried, in order (more than one: a failover)."""
    failures: tuple[tuple[str, str], ...] = ()
    """Each host of ``tried`` that failed and another was tried, with why, in order
    (``("gpu-a", "broke before any content (connection reset)")``)."""
    cut_off: bool = False
    """The answer had begun and was cut off (the host broke it off, or went quiet)."""
    client_left: bool = False
    """The client went away before the end of its answer."""
    moved_from: str | None = None
    """The home host a ``cache_affinity`` conversation was moved away from."""
    refused: bool = False
    """Refused from its head at the door: never reached the proxy (counted by the site)."""
    waited: float | None = None
    """Seconds it waited in crossbar for a slot; ``None``: it did not wait."""
    shed: str | None = None
    """Answered without a host by the queue: ``limit``, ``timeout`` or ``stopping``."""
    key: str | None = None
    """Who asked, for usage: a key's holder by name, an unnamed key by a fingerprint that
    cannot be turned back into it; ``None`` on a route without keys."""
    prompt_tokens: int | None = None
    """Every prompt token the answer reported, cached ones included."""
    cached_tokens: int | None = None
    """Of those, the ones the host read from its prompt cache."""
    generated_tokens: int | None = None
    first_token: float | None = None
    """Seconds until the answer's first content event: not its head, not a ping."""
    tokens_per_second: float | None = None
    """Generation speed, as the host timed it, else as crossbar saw the content come."""
    loads: int = 0
    """Loads of its model it made a host begin (the host chosen had it loaded nowhere and no
    load under way): 0 or 1, more only after a failover that made another host load it."""
    reason: str | None = None
    """Why crossbar answered it itself, in the words the client got (``unknown route``,
    ``unauthorized: no key sent``...); ``None`` for an answer a host made."""
    size_note: str | None = None
    """What its prompt's size changed, in words: the hosts passed over as too small for it
    (``~9000 tokens: too long for gpu-a``), a host's refusal and the move to another
    (``moved: 9120 tokens > gpu-a's window 8192``), or crossbar's own refusal when no host
    fits (``too long for every host: ...``)."""
    generates: bool = True
    """A request that takes a slot of its host (a POST to a path that generates): only
    such a one is a served request of its key; listing models, tokenizing are not."""
    asked_model: str | None = None
    """The name the client sent, when one of the route's aliases mapped it to ``model``
    (it matched a pattern the admin wrote); ``None`` otherwise."""

    def notes(self) -> Sequence[str]:
        """What went unusually, in words: ``client left``, ``tried gpu-a, gpu-b``..."""
        notes = ["answer cut off"] if self.cut_off else ["client left"] if self.client_left else []
        if len(self.tried) > 1 or self.failures:
            why = dict(self.failures)
            tried = (f"{host}: {why[host]}" if host in why else host for host in self.tried)
            notes.append(f"tried {', '.join(tried)}")
        if self.moved_from is not None:
            notes.append(f"moved from {self.moved_from}")
        if self.waited is not None:
            notes.append(f"waited {self.waited * 1000:.0f}ms for a slot")
        if self.reason is not None:
            notes.append(self.reason)
        if self.size_note is not None:
            notes.append(self.size_note)
        return notes


class ProxyObserver(Protocol):
    """Told of every request as it ends (the metrics, the recent window, the access log)."""

    def request_done(self, record: RequestRecord) -> None: ...


class Observers:
    """Several observers behind one, each told in turn."""

    def __init__(self, *observers: ProxyObserver) -> None:
        self._calls = tuple(observer.request_done for observer in observers)

    def request_done(self, record: RequestRecord) -> None:
        for call in self._calls:
            call(record)


def refused_record(
    status: int, method: bytes, path: bytes, reason: str | None = None
) -> RequestRecord:
    """The record of a request refused from its head at the door (it reached no route),
    and why, in the words it was answered."""
    return RequestRecord(
        "-", None, status, 0.0, method=method, path=path, refused=True, reason=reason
    )

"""What every proxied request works with, built once by the composition root."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from crossbar.config import Config, HostSettings
from crossbar.http import host_keys
from crossbar.polling import HealthTable
from crossbar.prefixes import PrefixKeeper
from crossbar.queueing import Traffic, Waits
from crossbar.routing import PromptSizes
from crossbar.stats import ProxyObserver
from crossbar.upstream import Upstreams


class PlacementsTold(Protocol):
    """The other processes' knowledge of this one's placements (workers, replicas)."""

    def told(self, key: bytes) -> Deferred[None] | None:
        """``None`` when the others know where conversation ``key`` lives; else what
        fires once they do (:class:`~crossbar.sharing.placesync.PlacementSync`)."""
        ...


@attrs.frozen
class ProxyContext:
    """Everything an exchange works with, built once by the composition root."""

    config: Config
    table: HealthTable
    traffic: Traffic
    upstreams: Upstreams
    clock: IReactorTime
    observer: ProxyObserver
    waits: Waits | None = None
    """Where requests wait for a slot; ``None``: every request is sent on at once."""
    prefixes: PrefixKeeper | None = None
    """Saves and restores shared prompt prefixes on hosts; ``None``: never."""
    placements: PlacementsTold | None = None
    """With workers or replicas: a turn placed anew waits until the others know its host."""
    sizes: PromptSizes = attrs.field(factory=PromptSizes)
    """Bytes per prompt token learned per model and API, and each conversation's last
    size: a request's prompt tokens guessed before it is sent (routing by fit)."""
    settings: Mapping[str, HostSettings] = attrs.field(
        init=False, default=attrs.Factory(lambda self: self.table.settings, takes_self=True)
    )
    """The table's per-host settings, read several times per request: kept at hand."""
    host_keys: Mapping[str, bytes] = attrs.field(
        init=False, default=attrs.Factory(lambda self: host_keys(self.config), takes_self=True)
    )
    """The ``Authorization`` line of each host that has an ``api_key``."""

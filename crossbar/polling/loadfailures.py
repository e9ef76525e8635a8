"""Models a host failed to load lately, each backed off for a while. Pure, no I/O.

A router that cannot load a model (too little memory, a broken file) answers
``500 {"error": {"message": "model name=X failed to load"}}``, and would answer every
request for it the same. Without a memory of it, a route with ``spillover`` sends each
waiting request there in turn, and each fails. So a failed load is remembered per host
and model: that host is not chosen to load that model for :data:`FIRST_BACKOFF` seconds,
doubled at each failure in a row up to :data:`MOST_BACKOFF`; a poll that lists the
model loaded there forgets it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

FIRST_BACKOFF = 30.0
"""Seconds a host is not asked again to load a model it failed to load once."""
MOST_BACKOFF = 900.0
"""Longest back-off, however often the load failed."""
MOST_MODELS = 100
"""Models remembered per host: a client naming made-up models cannot grow it past this."""
_MARK = b"failed to load"
LOOKED_AT = 4096
"""Bytes of an answer's body looked at for :data:`_MARK`."""


def failed_load(status: int, body: bytes) -> bool:
    """Whether an answer (its status and the start of its body) says the host failed to
    load the model asked for (a llama-server router's ``500 ... failed to load``)."""
    return status == 500 and _MARK in body[:LOOKED_AT]


@attrs.frozen
class FailedLoad:
    """One model's failed loads on one host."""

    failures: int
    """In a row, since the model was last seen loaded there."""
    until: float
    """When the host may be asked to load it again."""

    def to_json(self, now: float) -> dict[str, Any]:
        return {"failures": self.failures, "backed_off_seconds": max(0, round(self.until - now))}


def _frozen(models: Mapping[str, FailedLoad]) -> Mapping[str, FailedLoad]:
    return MappingProxyType(dict(models))


@attrs.frozen
class LoadFailures:
    """A host's failed loads: by model, and how many in all since crossbar started."""

    models: Mapping[str, FailedLoad] = attrs.field(factory=dict, converter=_frozen, eq=False)
    total: int = 0

    def failed(self, model: str, now: float) -> LoadFailures:
        """With one more failed load of ``model`` at ``now``."""
        models = dict(self.models)
        failures = models[model].failures + 1 if model in models else 1
        backoff = min(MOST_BACKOFF, FIRST_BACKOFF * 2 ** min(failures - 1, 30))
        models.pop(model, None)
        models[model] = FailedLoad(failures, now + backoff)
        while len(models) > MOST_MODELS:  # the oldest failure goes first
            del models[next(iter(models))]
        return LoadFailures(models, self.total + 1)

    def cleared(self, loaded: Iterable[str]) -> LoadFailures:
        """Without the models now seen loaded: their loads worked."""
        if not self.models:
            return self
        gone = self.models.keys() & set(loaded)
        if not gone:
            return self
        return LoadFailures({m: f for m, f in self.models.items() if m not in gone}, self.total)

    def backed_off(self, model: str | None, now: float) -> bool:
        """Whether the host is not to be asked to load ``model`` now."""
        if not self.models or model is None:
            return False
        failed = self.models.get(model)
        return failed is not None and now < failed.until

    def to_json(self, now: float) -> dict[str, Any]:
        """The count, and the models backed off now."""
        backed = {m: f.to_json(now) for m, f in sorted(self.models.items()) if now < f.until}
        return {"total": self.total, "backed_off": backed}

    def said(self, now: float) -> str:
        """In words for the page; empty when nothing is backed off."""
        backed = [(m, f) for m, f in sorted(self.models.items()) if now < f.until]
        return "; ".join(
            f"{m} failed to load ({f.failures}x), not tried for {round(f.until - now)} s"
            for m, f in backed
        )


NO_FAILURES = LoadFailures()
"""A host that has failed no load."""

"""What the page, the JSON, the metrics and the log say of each host's models: the loaded
ones with their requests in flight and idle time, how much of a router's room they take
("2 of 4 instances"), where a model loaded nowhere would be loaded and what that evicts, and
the loads and evictions the polls saw (``status.value`` going to and from ``loaded``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from twisted.logger import Logger

from crossbar.pages.times import duration
from crossbar.polling import Clock, HostState
from crossbar.routing import BUSY, EVICTS, FREE, LOADING, NO_AUTOLOAD, LoadCost, Occupancy

log = Logger()


def idle_words(seconds: float | None) -> str:
    """``"idle 14 min"``; a model crossbar never sent a request: ``"unused since start"``."""
    if seconds is None or math.isinf(seconds):
        return "unused since crossbar started"
    return f"idle {duration(seconds)}"


def instances_words(state: HostState, usage: Occupancy) -> str | None:
    """``"2 of 4 instances"``: the models a router runs or loads, of its ``max_instances``."""
    if state.max_instances is None:
        return None
    return f"{len(usage.running(state))} of {state.max_instances} instances"


def model_notes(state: HostState, usage: Occupancy, now: float) -> dict[str, str]:
    """A note per loaded model: its slots and a slot's window where known, then its
    requests in flight or how long it has been idle (on a router, where it matters for
    what is evicted)."""
    notes = {}
    for model in state.loaded:
        parts = [f"{state.slots[model]} slots"] if model in state.slots else []
        if model in state.windows:
            parts.append(f"{window_words(state.windows[model])} a slot")
        if state.max_instances is not None:
            busy = usage.busy.get((state.name, model), 0)
            idle = usage.idle(state.name, model, now)
            parts.append(f"{busy} in flight" if busy else idle_words(idle))
        if parts:
            notes[model] = "; ".join(parts)
    return notes


def window_words(tokens: int) -> str:
    """A window in words: "16k tokens" for a whole number of thousands (1,024 each), else
    the tokens counted: "2,000 tokens"."""
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens // 1024:,}k tokens"
    return f"{tokens:,} tokens"


def models_json(state: HostState, usage: Occupancy, now: float) -> dict[str, Any]:
    """Per loaded model, its requests in flight and idle seconds (``null``: never used
    through crossbar), and the room taken when known: for a host's JSON."""
    models = {}
    for model in state.loaded:
        idle = usage.idle(state.name, model, now)
        models[model] = {
            "in_flight": usage.busy.get((state.name, model), 0),
            "idle_seconds": None if math.isinf(idle) else round(idle, 1),
        }
        if model in state.windows:
            models[model]["window"] = state.windows[model]
    doc: dict[str, Any] = {"models": models}
    if state.max_instances is not None:
        doc["instances"] = {"used": len(usage.running(state)), "max": state.max_instances}
    return doc


def load_words(load: LoadCost, model: str | None) -> str:
    """What loading ``model`` on the chosen host costs, for "where a request goes now"."""
    if load.rank == LOADING:
        return f"(loading {model} there: waits for that load)"
    if load.rank == FREE:
        return f"(would load {model}: {load.free} of {load.instances} instances free)"
    if load.rank == EVICTS:
        return f"(would load {model}, evicting {load.evicts}, {idle_words(load.idle)})"
    if load.rank == BUSY:
        return f"(would load {model} once one of its models is idle: all busy)"
    if load.rank == NO_AUTOLOAD:
        return f"(does not load {model} by itself: models_autoload is off)"
    return f"(knows {model}; would load it)"


class ModelEvents:
    """Loads and evictions, seen from the polls: ``crossbar_model_loads_total`` and
    ``crossbar_model_evictions_total`` by host and model, and one log line each, e.g.
    ``gpu-b loads gpt-oss-20b (evicts qwen-7b, idle 14 min)``. A model a poll no longer
    lists as loaded counts as evicted, whoever unloaded it."""

    def __init__(self, usage: Occupancy, clock: Clock) -> None:
        self._usage = usage
        self._clock = clock
        self.loads: dict[tuple[str, str], int] = {}
        self.evictions: dict[tuple[str, str], int] = {}

    def seen(self, old: HostState, new: HostState) -> None:
        """A poll of a host listed other models loaded than the one before."""
        host, now = new.name, self._clock.seconds()
        loaded = [m for m in new.loaded if m not in old.loaded]
        gone = [m for m in old.loaded if m not in new.loaded]
        for model in loaded:
            self.loads[host, model] = self.loads.get((host, model), 0) + 1
        for model in gone:
            self.evictions[host, model] = self.evictions.get((host, model), 0) + 1
        words = {m: idle_words(self._usage.idle(host, m, now)) for m in gone}
        for index, model in enumerate(loaded):
            victim = gone[index] if index < len(gone) else None
            if victim is None:
                log.info("{host} loads {model}", host=host, model=model)
            else:
                said = "{host} loads {model} (evicts {victim}, {idle})"
                log.info(said, host=host, model=model, victim=victim, idle=words[victim])
        for victim in gone[len(loaded) :]:
            log.info(
                "{host} unloads {victim} ({idle})", host=host, victim=victim, idle=words[victim]
            )

    def collect(self) -> Iterable[Metric]:
        loads = CounterMetricFamily(
            "crossbar_model_loads",
            "Models a host's polls showed newly loaded.",
            labels=["host", "model"],
        )
        evictions = CounterMetricFamily(
            "crossbar_model_evictions",
            "Models a host's polls no longer showed loaded (evicted or unloaded).",
            labels=["host", "model"],
        )
        for (host, model), count in sorted(self.loads.items()):
            loads.add_metric([host, model], count)
        for (host, model), count in sorted(self.evictions.items()):
            evictions.add_metric([host, model], count)
        return [loads, evictions]

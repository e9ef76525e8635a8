"""The health table: who is up, and which models each host has resident.

A :class:`HealthTable` holds one immutable :class:`HostState` per host and is the
single source of truth the proxy and the status pages read. The poller
(:mod:`crossbar.polling.poller`) and the proxy's passive checks feed it; the rules of
when a host is trusted again live here, with no I/O, so each is cheap to test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from crossbar.config import HostSettings
from crossbar.polling.loadfailures import NO_FAILURES, LoadFailures
from crossbar.polling.routerprops import Room


def _frozen(slots: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(slots))


class Clock(Protocol):
    """What the table needs of a reactor: the time."""

    def seconds(self) -> float: ...


@attrs.frozen
class HostState:
    """What crossbar knows of one host. Immutable: readers can never change the table."""

    name: str
    url: str
    healthy: bool = False
    loaded: tuple[str, ...] = ()
    known: tuple[str, ...] = ()
    consecutive: int = 0
    last_ok: float | None = None
    last_err: str = ""
    has_failed: bool = False
    polled: bool = False
    """A poll of this host has ended (either way); until then its state is unknown."""
    polls: int = 0
    poll_failures: int = 0
    fails: int = 0
    """Real requests that failed in a row (passive health), reset by one that did not."""
    models_listed: int = 0
    """Entries of the host's last model list, kept or not."""
    models_note: str = ""
    """What of that list was left out (past the cap, bad ids), in words; usually empty."""
    slots: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen, hash=False)
    """Slots the host said each loaded model runs (model id -> ``total_slots``), as the
    poller learned them; a model not loaded, or not yet asked about, has no entry."""

    loading: tuple[str, ...] = ()
    """Models the host's last list showed ``loading``."""
    max_instances: int | None = None
    """Models the host runs at once: its ``models_max:`` from the config, else what the
    router's own ``/props`` said; ``None`` when unknown (and for single-model hosts)."""
    autoload: bool | None = None
    """Whether the router loads a model a request names (``models_autoload``)."""
    windows: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen, hash=False)
    """The window of one slot of each loaded model (model id -> tokens: its
    ``default_generation_settings.n_ctx``, or what a refused request showed), as learned."""
    trained: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen, hash=False)
    """Each listed model's training context (``meta.n_ctx_train``): no slot of it is longer
    (unless the host overrides it), so an upper bound while its window is unknown."""

    def window(self, model: str | None) -> int | None:
        """The window of a slot of ``model`` here as learned, or ``None`` when unknown."""
        return None if model is None else self.windows.get(model)

    def window_bound(self, model: str | None) -> int | None:
        """The longest a slot of ``model`` here can be: its window when learned, else its
        training context when listed, else ``None``."""
        if model is None:
            return None
        return self.windows.get(model) or self.trained.get(model)

    load_failures: LoadFailures = NO_FAILURES
    """The models it failed to load lately, each backed off (:meth:`HealthTable.load_failed`)."""

    def capacity(self, model: str) -> int | None:
        """The slots ``model`` runs here as learned, or ``None`` when unknown; a host's
        ``slots:`` in the config overrides this (the caller applies it)."""
        return self.slots.get(model)

    @property
    def state(self) -> str:
        if not self.polled and not self.has_failed:
            return "unknown"
        return "up" if self.healthy else "down"

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The state as the status JSON shows it; ``now``: the time, to show how long each
        model that failed to load is backed off."""
        doc: dict[str, Any] = {
            "url": self.url,
            "healthy": self.healthy,
            "state": self.state,
            "loaded": list(self.loaded),
            "known": list(self.known),
            "consecutive": self.consecutive,
            "last_ok": self.last_ok,
            "last_err": self.last_err,
        }
        if self.models_note:  # only for a list that was cut or had bad ids
            doc["models_listed"] = self.models_listed
            doc["models_note"] = self.models_note
        if self.slots:  # only once some are known: without them the document is as before
            doc["slots"] = dict(sorted(self.slots.items()))
        if self.max_instances is not None:  # a router's room, once known
            doc["max_instances"] = self.max_instances
        if self.loading:
            doc["loading"] = list(self.loading)
        if self.windows:  # tokens a slot of each loaded model holds, once known
            doc["windows"] = dict(sorted(self.windows.items()))
        if self.trained:
            doc["trained"] = dict(sorted(self.trained.items()))
        if self.load_failures.total and now is not None:
            doc["failed_loads"] = self.load_failures.to_json(now)
        return doc


class HealthTable:
    """Per-host state: what the polls said (:meth:`record_ok`, :meth:`record_failure`),
    what requests said (:meth:`request_failed`, :meth:`judge_answer`, :meth:`request_ok`,
    :meth:`mark_down`), and a reload's hosts (:meth:`set_hosts`, :meth:`remove`). A host
    going up or down by a poll or a request is told to the listeners (:meth:`on_change`);
    a reload tells none: nothing was observed."""

    def __init__(
        self,
        hosts: Mapping[str, str],
        clock: Clock,
        settings: Mapping[str, HostSettings] | None = None,
        *,
        listeners: Sequence[Callable[[HostState, HostState], None]] = (),
        slots_learned: Callable[[], None] | None = None,
        models_changed: Callable[[HostState, HostState], None] | None = None,
    ) -> None:
        self._clock = clock
        self._states = {name: HostState(name=name, url=url) for name, url in hosts.items()}
        self._view = MappingProxyType(self._states)
        default = HostSettings()
        self.settings: Mapping[str, HostSettings] = {
            name: (settings or {}).get(name, default) for name in hosts
        }
        """Every host's settings: the one place the poller and the proxy read them."""
        self._listeners = list(listeners)
        """Told ``(old, new)`` when a host goes up or down."""
        self.slots_learned = slots_learned
        """Told when what a host said of its models' slots changed."""
        self.models_changed = models_changed
        """Told ``(old, new)`` when a poll lists other models loaded than the last one did
        (not at a host's first poll): the loads and evictions a router made."""
        self._models: frozenset[str] = frozenset()
        self._rooms: dict[str, Room] = {}
        """What each host's own ``/props`` said of its room."""
        for name in self._states:
            self._apply_room(name)

    def set_hosts(
        self,
        hosts: Mapping[str, str],
        settings: Mapping[str, HostSettings],
        fresh: Iterable[str] = (),
        keep: Iterable[str] = (),
    ) -> None:
        """Take a reloaded config's hosts. A host that stays keeps its state; a new one,
        or one in ``fresh`` (a new address under an old name), starts ``unknown``. Hosts
        in ``keep`` are no longer configured but still carry requests: they stay, with
        their settings, until :meth:`remove`. No listener is told: nothing was observed."""
        fresh = set(fresh)
        states = {}
        for name, url in hosts.items():
            old = self._states.get(name)
            keeps = old is not None and old.url == url and name not in fresh
            states[name] = old if keeps and old is not None else HostState(name=name, url=url)
        default = HostSettings()
        new_settings = {name: settings.get(name, default) for name in hosts}
        for name in keep:
            if name in self._states and name not in hosts:
                states[name] = self._states[name]
                new_settings[name] = self.settings[name]
        before = dict(self._states)
        self._states.clear()  # in place: the live view stays valid
        self._states.update(states)
        self.settings = new_settings
        # A host that starts afresh (new, or at a new address) has its room asked again.
        self._rooms = {n: r for n, r in self._rooms.items() if before.get(n) is states.get(n)}
        for name in states:
            self._apply_room(name)
        self._models = frozenset().union(*(s.known for s in states.values()))

    def remove(self, name: str) -> None:
        """Forget a host that has left the config and carries no more requests."""
        self._states.pop(name, None)
        self._rooms.pop(name, None)
        self.settings = {n: s for n, s in self.settings.items() if n != name}
        self._models = frozenset().union(*(s.known for s in self._states.values()))

    @property
    def names(self) -> list[str]:
        return list(self._states)

    def get(self, name: str) -> HostState | None:
        return self._states.get(name)

    @property
    def view(self) -> Mapping[str, HostState]:
        """A live read-only view of the states: nothing copied, for the request path."""
        return self._view

    def snapshot(self) -> dict[str, HostState]:
        """A new dict of the current (immutable) states."""
        return dict(self._states)

    def on_change(self, listener: Callable[[HostState, HostState], None]) -> None:
        """Call ``listener(old, new)`` whenever a host's ``state`` changes."""
        self._listeners.append(listener)

    def knows(self, model: str) -> bool:
        """Whether any host has listed ``model`` (loaded or not) in a poll that went well."""
        return model in self._models

    def record_ok(
        self,
        name: str,
        loaded: Iterable[str],
        known: Iterable[str],
        *,
        listed: int | None = None,
        note: str = "",
        loading: Iterable[str] = (),
        trained: Mapping[str, int] | None = None,
    ) -> None:
        """A poll went well; ``listed`` and ``note``: the list's size and what of it was
        left out (see :class:`crossbar.polling.modellist.ModelList`); ``loading``: the models
        it lists as loading; ``trained``: the training context it lists for models."""
        old = self._states.get(name)
        if old is None:
            return
        known = tuple(sorted(set(known)))
        if known != old.known:
            others = (s.known for n, s in self._states.items() if n != name)
            self._models = frozenset(known).union(*others)
        loaded = tuple(sorted(set(loaded)))
        consecutive = old.consecutive + 1
        healthy = not old.has_failed or consecutive >= self.settings[name].recovery_polls
        new = attrs.evolve(
            old,
            healthy=healthy,
            fails=0 if healthy and not old.healthy else old.fails,
            loaded=loaded,
            known=known,
            loading=tuple(sorted(set(loading))),
            slots={m: n for m, n in old.slots.items() if m in loaded},
            windows={m: n for m, n in old.windows.items() if m in loaded},
            trained=old.trained if trained is None else trained,
            load_failures=old.load_failures.cleared(loaded),
            consecutive=consecutive,
            last_ok=self._clock.seconds(),
            last_err="",
            polled=True,
            polls=old.polls + 1,
            models_listed=len(known) if listed is None else listed,
            models_note=note,
        )
        self._set(new)
        if old.last_ok is not None and old.loaded != loaded and self.models_changed is not None:
            self.models_changed(old, new)

    def record_slots(self, name: str, model: str, slots: int | None) -> None:
        """What the host said of a loaded model's slots (``None``: nothing usable). Kept
        only while the model is loaded, as last listed; nobody is told: up or down is
        unchanged."""
        old = self._states.get(name)
        if old is None or (model not in old.loaded and model not in old.slots):
            return
        learned = _learned(old.slots, model, slots, old.loaded)
        self._states[name] = attrs.evolve(old, slots=learned)
        if learned != old.slots and self.slots_learned is not None:
            self.slots_learned()

    def record_window(self, name: str, model: str, window: int | None) -> None:
        """The window of a slot of a loaded model, as its ``/props`` said (``None``: nothing
        usable) or as a host's refusal of a long prompt showed (its ``n_ctx``). Kept only
        while the model is loaded, as last listed; nobody is told."""
        old = self._states.get(name)
        if old is None or (model not in old.loaded and model not in old.windows):
            return
        learned = _learned(old.windows, model, window, old.loaded)
        if learned != old.windows:
            self._states[name] = attrs.evolve(old, windows=learned)

    def record_room(self, name: str, room: Room) -> None:
        """What the host's own ``/props`` said of its room (unknown fields: not said);
        a host's ``models_max:`` in the config overrides it. Nobody is told."""
        if name in self._states:
            self._rooms[name] = room
            self._apply_room(name)

    def _apply_room(self, name: str) -> None:
        state, room = self._states[name], self._rooms.get(name, Room())
        configured = self.settings[name].models_max
        instances = configured if configured is not None else room.max_instances
        if (state.max_instances, state.autoload) != (instances, room.autoload):
            self._states[name] = attrs.evolve(
                state, max_instances=instances, autoload=room.autoload
            )

    def record_failure(self, name: str, reason: str, *, poll: bool = True) -> None:
        old = self._states.get(name)
        if old is None:
            return
        self._set(
            attrs.evolve(
                old,
                healthy=False,
                consecutive=0,
                last_err=reason,
                has_failed=True,
                polled=old.polled or poll,
                polls=old.polls + poll,
                poll_failures=old.poll_failures + poll,
            )
        )

    def mark_down(self, name: str, reason: str) -> None:
        """Take a host out of service at once, whatever its ``max_fails``."""
        self.record_failure(name, f"marked down: {reason}", poll=False)

    def request_failed(self, name: str, reason: str) -> None:
        """A real request to this host failed; ``max_fails`` in a row mark it down."""
        old = self._states.get(name)
        if old is None:
            return
        fails = old.fails + 1
        if fails >= self.settings[name].max_fails:
            self.mark_down(name, reason)
            self._states[name] = attrs.evolve(self._states[name], fails=fails)
        else:
            self._states[name] = attrs.evolve(old, fails=fails)

    def judge_answer(self, name: str, code: int, latency: float) -> None:
        """Passive health: a real answer (its status, its time to the status line) can
        count as a failure of its host, by the host's ``unhealthy_*`` settings."""
        settings = self.settings[name]
        if code in settings.unhealthy_status:
            self.request_failed(name, f"HTTP {code}")
        elif settings.unhealthy_latency is not None and latency > settings.unhealthy_latency:
            self.request_failed(name, f"answered after {latency:.1f}s")
        else:
            self.request_ok(name)

    def load_failed(self, name: str, model: str) -> None:
        """The host answered that it failed to load ``model``: it is not asked to load it
        again for a while (longer at each failure in a row). Up or down is unchanged."""
        old = self._states.get(name)
        if old is not None:
            failures = old.load_failures.failed(model, self._clock.seconds())
            self._states[name] = attrs.evolve(old, load_failures=failures)

    def request_ok(self, name: str) -> None:
        """A real request to this host went well: its run of failures is over."""
        old = self._states.get(name)
        if old is not None and old.fails:
            self._states[name] = attrs.evolve(old, fails=0)

    def _set(self, new: HostState) -> None:
        old = self._states[new.name]
        self._states[new.name] = new
        if old.state != new.state:
            for listener in self._listeners:
                listener(old, new)


def _learned(
    known: Mapping[str, int], model: str, value: int | None, loaded: Iterable[str]
) -> dict[str, int]:
    """What a host said of each loaded model (its slots, its window), once it said
    ``value`` of ``model``: kept while the model is loaded, forgotten once not usable."""
    learned = {m: n for m, n in known.items() if m != model}
    if value is not None and model in loaded:
        learned[model] = value
    return learned

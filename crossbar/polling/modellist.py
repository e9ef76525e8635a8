"""Model lists: what a host's ``GET /v1/models`` answer says it has, and the one list a
route with ``list_models: merged`` answers for all its healthy hosts. Pure, no I/O.

Every host's list is read every few seconds, on the reactor thread, and a router may
know thousands of models: msgspec reads only the fields used (``data[].id`` and
``data[].status.value``) into structs and skips every other field in C, without
building it (100,000 entries, 10 to 14 MiB: about 30 ms, where reading them with
``json.loads`` took 160 to 280 ms).

A host's list is held to :data:`MAX_MODELS` models of ids up to :data:`MAX_ID_BYTES`
(:func:`read_models`): a lab has tens of models, and every page, listing and choice
reads the lists, so a host listing half a million ids must not make each of them slow.
An id with a control character is dropped: it would reach the page, the JSON and the
metrics' labels raw. So is one of crossbar's own names for what no host lists
(:data:`OTHER_MODEL`, :data:`NO_MODEL`): a host's model never shares their sums.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
import msgspec
from msgspec import UNSET, Raw, UnsetType

from crossbar.config import RouteConfig
from crossbar.polling.health import HostState

_Value = str | int | float | bool | list[Raw] | dict[str, Raw] | None
"""Any JSON value; an array's or object's contents are left unread (a hostile host's
huge or deep value costs nothing to skip)."""


# gc=False: decoded from JSON, these can never be part of a reference cycle, and
# tracking a hundred thousand of them would cost more than reading them.
class _Status(msgspec.Struct, gc=False):
    value: _Value | UnsetType = UNSET


class _Meta(msgspec.Struct, gc=False):
    n_ctx_train: _Value | UnsetType = UNSET


class _Entry(msgspec.Struct, gc=False):
    id: _Value | UnsetType = UNSET
    status: _Status | str | int | float | bool | list[Raw] | UnsetType | None = UNSET
    meta: _Meta | str | int | float | bool | list[Raw] | UnsetType | None = UNSET


class _Listing(msgspec.Struct, gc=False):
    data: list[_Entry]


_LISTING = msgspec.json.Decoder(_Listing)
_OUTLINE = msgspec.json.Decoder(dict[str, Raw])
_ITEMS = msgspec.json.Decoder(list[Raw])
_NOT_A_LIST = 'expected {"data": [...]}'

MAX_MODELS = 1000
"""Models kept of one host's list (the first ones listed); the rest are counted only."""
MAX_ID_BYTES = 256
"""Longest model id kept (UTF-8 bytes); a longer one is dropped."""
MAX_MERGED = 1000
"""Models a merged ``/v1/models`` answer lists at most."""
MAX_TRAINED = 1 << 24
"""Largest training context believed (tokens); more, or fewer than one, is unknown."""
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
OTHER_MODEL = "(other)"
"""How a model no host lists is shown in the metrics, the JSON log and the usage store: a
client may write any name, of any length, and must not choose what they hold."""
NO_MODEL = "(none)"
"""The model of a request that named none (and no route's default applied)."""
OWN_NAMES = frozenset({OTHER_MODEL, NO_MODEL})
"""Ids a host may not list: crossbar's own placeholders."""


@attrs.frozen
class ModelList:
    """What crossbar keeps of one host's ``/v1/models`` answer."""

    loaded: tuple[str, ...]
    known: tuple[str, ...]
    """At most :data:`MAX_MODELS`, unique, in the order listed."""
    listed: int = 0
    """Entries in the answer."""
    cut: bool = False
    """More than :data:`MAX_MODELS` models were listed: the rest were not read."""
    dropped: int = 0
    """Ids dropped (among those read): too long, with a control character, or one of
    :data:`OWN_NAMES`."""
    loading: tuple[str, ...] = ()
    """Models listed as ``loading`` (a router's), in the order listed."""
    trained: tuple[tuple[str, int], ...] = ()
    """``(model, meta.n_ctx_train)`` of the models whose entry tells a believable one."""

    @property
    def note(self) -> str:
        """What was left out, in words for the page and the JSON; empty when nothing was."""
        parts = []
        if self.cut:
            parts.append(f"lists {self.listed:,} models: only the first {MAX_MODELS:,} are used")
        if self.dropped:
            ids = "model id" if self.dropped == 1 else "model ids"
            parts.append(
                f"{self.dropped:,} {ids} dropped (over {MAX_ID_BYTES} bytes, with a"
                " control character, or one of crossbar's own names: (other), (none))"
            )
        return "; ".join(parts)


def read_models(body: bytes) -> ModelList:
    """A host's list as crossbar keeps it: :func:`parse_models`'s reading, held to
    :data:`MAX_MODELS` distinct ids of at most :data:`MAX_ID_BYTES` bytes without
    control characters. Entries past the cap are counted, never looked at."""
    entries = _entries(body)
    loaded: dict[str, None] = {}
    known: dict[str, None] = {}
    loading: dict[str, None] = {}
    trained: dict[str, int] = {}
    dropped = 0
    cut = False
    for entry in entries:
        model_id = entry.id
        if type(model_id) is not str or not model_id:
            continue
        if len(model_id) * 4 > MAX_ID_BYTES and len(model_id.encode()) > MAX_ID_BYTES:
            dropped += 1
            continue
        if _CONTROL.search(model_id) or model_id in OWN_NAMES:
            dropped += 1
            continue
        if model_id not in known:
            if len(known) >= MAX_MODELS:
                cut = True
                break
            known[model_id] = None
        if _resident(entry):
            loaded[model_id] = None
        elif isinstance(entry.status, _Status) and entry.status.value == "loading":
            loading[model_id] = None
        meta = entry.meta
        if isinstance(meta, _Meta):
            n = meta.n_ctx_train
            if type(n) is int and 1 <= n <= MAX_TRAINED:
                trained[model_id] = n
    return ModelList(
        tuple(loaded),
        tuple(known),
        len(entries),
        cut,
        dropped,
        tuple(loading),
        tuple(trained.items()),
    )


def parse_models(body: bytes) -> tuple[list[str], list[str]]:
    """``(loaded, known)`` model ids from a ``/v1/models`` answer, every one as listed
    (see :func:`read_models` for what crossbar keeps); ``ValueError`` (its text in words)
    when the answer is not such a list.

    In router mode every model the router knows is listed with ``status.value``;
    only ``loaded`` is resident. An entry without ``status`` (single-model
    llama-server) is resident. An entry whose id is not a non-empty string is skipped.
    """
    loaded: list[str] = []
    known: list[str] = []
    for entry in _entries(body):
        model_id = entry.id
        if type(model_id) is not str or not model_id:
            continue
        known.append(model_id)
        if _resident(entry):
            loaded.append(model_id)
    return loaded, known


def _entries(body: bytes) -> list[_Entry]:
    try:
        return _LISTING.decode(body).data
    except msgspec.ValidationError as e:
        raise ValueError(_misshapen(body, e)) from None
    except msgspec.DecodeError as e:
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _resident(entry: _Entry) -> bool:
    status = entry.status
    plain = status is None or status is UNSET  # a single-model llama-server's entry
    return plain or (isinstance(status, _Status) and status.value == "loaded")


def _misshapen(body: bytes, error: msgspec.ValidationError) -> str:
    """Which part of a well-formed answer is not a model list, found only when one is
    not: the same words whatever the shape."""
    try:
        data = _OUTLINE.decode(body).get("data")
        items = _ITEMS.decode(data) if data is not None else None
    except (msgspec.DecodeError, RecursionError):
        return _NOT_A_LIST
    if items is None:
        return _NOT_A_LIST
    for item in items:
        if memoryview(item)[:1].tobytes() != b"{":
            return "a data entry is not an object"
    return str(error)  # an entry's id or status msgspec cannot read, e.g. 1e999


def merged_listing(
    route: RouteConfig, states: Mapping[str, HostState], now: int
) -> dict[str, Any] | None:
    """Every model the route's healthy hosts know, once each, in the OpenAI list shape
    (the first :data:`MAX_MERGED` by id); ``None`` when no host of the route is healthy.

    ``status.value`` is ``loaded`` when any of them has the model resident, else
    ``unloaded`` (llama-server's words); ``owned_by`` names the hosts that have it loaded,
    or, when none has, the hosts that know it.

    A model whose slot window is known on some host also carries that window, the largest
    one (crossbar sends a prompt to a host where it fits), in the fields clients read for
    it (:func:`window_fields`); ``meta.n_ctx_train`` is the smallest training context its
    hosts list.
    """
    healthy = [states[h] for h in route.hosts if h in states and states[h].healthy]
    if not healthy:
        return None
    loaded: dict[str, list[str]] = {}
    known: dict[str, list[str]] = {}
    windows: dict[str, int] = {}
    trained: dict[str, int] = {}
    for state in healthy:
        for model in state.known:
            known.setdefault(model, []).append(state.name)
        for model in state.loaded:
            loaded.setdefault(model, []).append(state.name)
            known.setdefault(model, [])
        for model, window in state.windows.items():
            windows[model] = max(window, windows.get(model, 0))
        for model, n in state.trained.items():
            trained[model] = min(n, trained.get(model, n))
    data = []
    for model in sorted(known)[:MAX_MERGED]:
        entry: dict[str, Any] = {
            "id": model,
            "object": "model",
            "created": now,
            "owned_by": ", ".join(loaded.get(model) or known[model]),
            "status": {"value": "loaded" if model in loaded else "unloaded"},
        }
        if model in windows:
            entry.update(window_fields(windows[model]))
        if model in trained:
            entry["meta"] = {"n_ctx_train": trained[model]}
        data.append(entry)
    data += alias_entries(route, data, now)
    return {"object": "list", "data": data}


def alias_entries(
    route: RouteConfig, listed: list[dict[str, Any]], now: int
) -> list[dict[str, Any]]:
    """An entry for each of the route's aliases, after the models, in the config's order:
    its pattern as ``id`` (a client that sends it back is served by its target), the target
    it stands for as ``alias_of``, and the target's own fields (its hosts as ``owned_by``,
    its status, its window) where a healthy host lists it."""
    by_id = {entry["id"]: entry for entry in listed}
    entries = []
    for pattern, target in route.aliases:
        own = by_id.get(target, {"owned_by": "", "status": {"value": "unloaded"}})
        entry = {"id": pattern, "object": "model", "created": now}
        entry |= {name: value for name, value in own.items() if name not in entry}
        entries.append(entry | {"alias_of": target})
    return entries


MAX_LISTING_BYTES = 1 << 20
"""Longest host's model list that a forwarded ``GET /v1/models`` reads whole to add the
windows: a longer one is relayed as it came."""


def with_windows(body: bytes, windows: Mapping[str, int]) -> dict[str, Any] | None:
    """A host's own model list (``body``, as it sent it) with each model's slot window on
    that host added (:func:`window_fields`) where crossbar knows it; ``None`` when it is not
    an OpenAI model list, or names no model whose window is known: then it goes as it came.
    Fields the host set itself are kept."""
    try:
        listing = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    added = False
    for entry in data:
        model = entry.get("id") if isinstance(entry, dict) else None
        window = windows.get(model) if isinstance(model, str) else None
        if window is not None:
            entry.update({k: v for k, v in window_fields(window).items() if k not in entry})
            added = True
    return listing if added else None


def window_fields(window: int) -> dict[str, int]:
    """A model's window in the fields clients of ``/v1/models`` look for: ``context_length``
    (OpenRouter's, read by OpenAI-compatible clients), ``max_model_len`` (vLLM's),
    ``max_input_tokens`` (Anthropic's model list, read by Claude Code for a model it does
    not know) and ``context_window``."""
    return {
        "context_length": window,
        "context_window": window,
        "max_input_tokens": window,
        "max_model_len": window,
    }

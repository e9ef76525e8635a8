"""Load and check ``crossbar.yaml``.

Every problem becomes one :class:`ConfigError` naming the file, the key as a dotted
path and what is wrong, so that a bad config stops start-up with one readable line
instead of a traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import attrs

from crossbar.config import model as model_
from crossbar.config.fields import (
    SETTING_PARSERS,
    parse_aliases,
    parse_count,
    parse_duration,
    parse_flag,
    parse_idle,
    parse_listen,
    parse_model_patterns,
    parse_networks,
    parse_optional_count,
    parse_retention,
    parse_size,
    parse_url,
    parse_usage_db,
    parse_workers,
    read_certificates,
    tcp_address,
)
from crossbar.config.model import (
    SETTING_KEYS,
    Config,
    HostConfig,
    HostSettings,
    Limits,
    RouteConfig,
)
from crossbar.config.secrets import PRIORITIES, KeyHolder, Secret, expand, mask_url
from crossbar.config.sharedstate import parse_shared_state

NAME = re.compile(r"[A-Za-z0-9._-]+")
_RESERVED_ROUTES = frozenset({"_crossbar"})
_ROUTE_KEYS = {"hosts", "default_model", "policy", "when_all_down", "list_models", "api_keys"}
_ROUTE_KEYS |= {"affinity_max_load", "home_wait", "queue", "max_waiting", "wait_timeout"}
_PER_KEY = ("max_waiting_per_key", "max_in_flight_per_key")
_ROUTE_KEYS |= {"spillover", *_PER_KEY, "models", "min_idle_before_evict", "aliases"}
_HOLDER_PARSERS: dict[str, Any] = dict.fromkeys(
    ("max_in_flight", "max_waiting", "max_loads_per_minute"), parse_count
) | {"models": parse_model_patterns}
_HOLDER_KEYS = {"name", "key", "priority"} | set(_HOLDER_PARSERS)
_HOLDER_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")
_HOST_KEYS = {"url", "api_key", "tls_ca", "slots"} | SETTING_KEYS
_LIMIT_PARSERS: dict[str, Any] = {
    "head_timeout": parse_duration,
    "body_timeout": parse_duration,
    "max_connections": parse_count,
    "max_connections_per_client": parse_count,
    "max_body_memory": parse_size,
    "max_body": parse_size,
}
_TOP_KEYS = (
    {"listen", "workers", "hosts", "routes", "api_keys", "status_keys", "status_listen"}
    | {"trusted_proxies", "drain_timeout", "log_format", "listen_reuse_port"}
    | {"usage_db", "usage_retention", "shared_state"}
    | set(_LIMIT_PARSERS)
    | SETTING_KEYS
)


class ConfigError(Exception):
    """A config that cannot be used; ``str()`` is the one line shown to the user.

    Key and problem quote what the file holds, so they are made fit to show here, for
    every error: a URL's password masked, line breaks and control characters escaped
    (a key may be ``"a\\nb"``), and at most :data:`MAX_PROBLEM` characters."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key = _fit(key)
        self.problem = problem = _fit(problem)
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {problem}")


class _Reader:
    """Walks the YAML tree and turns every problem into a ConfigError with its key path."""

    def __init__(self, source: str, base: Path | None = None) -> None:
        self.source = source
        self.base = base

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, key, problem)

    def mapping(self, value: object, key: str, allowed: set[str] | None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, not {_kind(value)}")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(key, f"keys must be strings, not {k!r}")
            if allowed is not None and k not in allowed:
                names = ", ".join(sorted(allowed))
                raise self.fail(_join(key, k), f"unknown key (expected one of: {names})")
        return value

    def name(self, value: str, key: str) -> str:
        if not NAME.fullmatch(value):
            raise self.fail(key, f"name {value!r} must match [A-Za-z0-9._-]+")
        return value

    def one_of(self, key: str, value: object, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, not {value!r}")
        return str(value)

    def keys(self, key: str, value: object) -> tuple[Secret, ...]:
        """A list of keys, each a literal or ``${VARIABLE}``; never quoted back."""
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list of keys, not {_kind(value)}")
        return tuple(self.key(f"{key}[{i}]", item) for i, item in enumerate(value))

    def key(self, key: str, value: object) -> Secret:
        if isinstance(value, dict):
            return self.held_key(key, value)
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string (a key or ${{VARIABLE}}), not {_kind(value)}")
        return self.convert(key, expand, value)  # type: ignore[no-any-return]

    def held_key(self, key: str, value: dict[str, Any]) -> Secret:
        """``{name: alice, key: "${ALICE_KEY}", priority: interactive, ...}``."""
        body = self.mapping(value, key, _HOLDER_KEYS)
        for required in ("name", "key"):
            if required not in body:
                raise self.fail(_join(key, required), "is missing")
        name = body["name"]
        if not isinstance(name, str) or not _HOLDER_NAME.fullmatch(name):
            problem = "must be 1 to 64 letters, digits, '.', '_', '@' or '-'"
            raise self.fail(_join(key, "name"), problem)
        priority = self.one_of(_join(key, "priority"), body.get("priority", "normal"), PRIORITIES)
        limits = {
            field: self.convert(_join(key, field), parse, body[field])
            for field, parse in _HOLDER_PARSERS.items()
            if field in body
        }
        secret = self.key(_join(key, "key"), body["key"])
        if secret.holder is not None:
            raise self.fail(_join(key, "key"), "must be a string (a key or ${VARIABLE})")
        return attrs.evolve(secret, holder=KeyHolder(name, priority, **limits))

    def convert(self, key: str, parse: Any, value: object) -> Any:
        try:
            return parse(value)
        except ValueError as e:
            raise self.fail(key, str(e)) from None


MAX_PROBLEM = 1000
"""Characters of a key or a problem: a value quoted whole may be a megabyte long."""


def _fit(text: str) -> str:
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in mask_url(text))
    return text if len(text) <= MAX_PROBLEM else text[: MAX_PROBLEM - 3] + "..."


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def parse_config(data: object, source: str = "crossbar.yaml", base: Path | None = None) -> Config:
    """Check a decoded YAML document and build the :class:`Config`; relative paths
    (``tls_ca``) are read from ``base``, the config file's directory."""
    r = _Reader(source, base)
    if data is None:
        raise r.fail("", "is empty")
    top = r.mapping(data, "", _TOP_KEYS)
    for required in ("hosts", "routes"):
        if required not in top:
            raise r.fail(required, "is missing")
    defaults = _settings(r, top, "", HostSettings())
    hosts = {
        name: _host(r, name, key, spec, defaults)
        for name, key, spec in _entries(r, top, "hosts", "host")
    }
    api_keys = r.keys("api_keys", top.get("api_keys"))
    routes = {
        name: _route(r, name, key, spec, hosts, api_keys)
        for name, key, spec in _entries(r, top, "routes", "route")
    }
    listen = r.convert("listen", parse_listen, top.get("listen", 7777))
    workers = r.convert("workers", parse_workers, top.get("workers", 1))
    reuse_port = r.convert("listen_reuse_port", parse_flag, top.get("listen_reuse_port", False))
    shared = workers > 1 or reuse_port  # SO_REUSEPORT: crossbar opens the TCP port itself
    if shared:
        r.convert("listen", tcp_address, listen)
    status_listen = None
    if top.get("status_listen") is not None:
        status_listen = r.convert("status_listen", parse_listen, top["status_listen"])
        if status_listen == listen:
            raise r.fail("status_listen", "must differ from listen")
        if shared:
            r.convert("status_listen", tcp_address, status_listen)
    limits = Limits(
        **{
            name: r.convert(name, parse, top[name])
            for name, parse in _LIMIT_PARSERS.items()
            if name in top
        }
    )
    if "max_body" not in top and limits.max_body > limits.max_body_memory:
        # A default follows the keys the admin wrote: only what was written can conflict.
        limits = attrs.evolve(limits, max_body=limits.max_body_memory)
    if limits.max_body > limits.max_body_memory:
        raise r.fail("max_body", "must not be more than max_body_memory")
    share = limits.max_connections_per_client
    if "max_connections_per_client" in top and share > limits.max_connections:
        problem = f"must not be more than max_connections ({limits.max_connections})"
        raise r.fail("max_connections_per_client", problem)
    return Config(
        listen=listen,
        listen_reuse_port=reuse_port,
        workers=workers,
        hosts=hosts,
        routes=routes,
        defaults=defaults,
        source=source,
        limits=limits,
        status_keys=r.keys("status_keys", top.get("status_keys")),
        status_listen=status_listen,
        trusted_proxies=r.convert("trusted_proxies", parse_networks, top.get("trusted_proxies")),
        drain_timeout=r.convert("drain_timeout", parse_duration, top.get("drain_timeout", 30.0)),
        log_format=cast(
            model_.LogFormat,
            r.one_of("log_format", top.get("log_format", "text"), model_.LOG_FORMATS),
        ),
        usage_db=_usage_db(r, top),
        shared_state=r.convert("shared_state", parse_shared_state, top.get("shared_state"))
        if top.get("shared_state") is not None
        else None,
        usage_retention=r.convert(
            "usage_retention", parse_retention, top.get("usage_retention", 90 * 86400.0)
        ),
    )


def _usage_db(r: _Reader, top: dict[str, Any]) -> str | None:
    """Missing: a file in the unit's ``$STATE_DIRECTORY`` under systemd (the config's
    folder is read-only there), else beside the config file; none for a config with no file."""
    if "usage_db" not in top:
        state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
        folder = None if r.base is None else Path(state) if state else r.base
        return None if folder is None else str(folder / model_.USAGE_DB_FILE)
    return r.convert("usage_db", lambda v: parse_usage_db(v, r.base), top["usage_db"])  # type: ignore[no-any-return]


def _entries(
    r: _Reader, top: dict[str, Any], section: str, what: str
) -> Iterator[tuple[str, str, object]]:
    """``(name, dotted key, value)`` of each entry of a named section, names checked."""
    entries = r.mapping(top[section], section, None)
    if not entries:
        raise r.fail(section, f"must name at least one {what}")
    for name, spec in entries.items():
        key = f"{section}.{name}"
        yield r.name(name, key), key, spec


def _host(r: _Reader, name: str, key: str, spec: object, defaults: HostSettings) -> HostConfig:
    if not isinstance(spec, dict):
        return HostConfig(name=name, url=r.convert(key, parse_url, spec))
    entry = r.mapping(spec, key, _HOST_KEYS)
    if "url" not in entry:
        raise r.fail(f"{key}.url", "is missing")
    url = r.convert(f"{key}.url", parse_url, entry["url"])
    own = _settings(r, entry, key, defaults)
    api_key = r.key(f"{key}.api_key", entry["api_key"]) if "api_key" in entry else None
    ca = ca_path = None
    if "tls_ca" in entry:
        if not url.startswith("https://"):
            raise r.fail(f"{key}.tls_ca", "is only for https:// hosts")
        ca_path, ca = r.convert(
            f"{key}.tls_ca", lambda v: read_certificates(v, r.base), entry["tls_ca"]
        )
    slots = r.convert(f"{key}.slots", parse_count, entry["slots"]) if "slots" in entry else None
    return HostConfig(name, url, own if own != defaults else None, api_key, ca, ca_path, slots)


def _route(
    r: _Reader,
    name: str,
    key: str,
    spec: object,
    hosts: dict[str, HostConfig],
    api_keys: tuple[Secret, ...],
) -> RouteConfig:
    if name in _RESERVED_ROUTES:
        raise r.fail(key, f"the name {name!r} is reserved for crossbar's own pages")
    if name.lower() == "v1":
        raise r.fail(key, "a route named v1 would read as the API's /v1: name the route")
    body = r.mapping(spec, key, _ROUTE_KEYS)
    members = body.get("hosts")
    if not isinstance(members, list) or not members:
        raise r.fail(f"{key}.hosts", "must be a non-empty list of host names")
    for i, member in enumerate(members):
        if not isinstance(member, str) or member not in hosts:
            raise r.fail(f"{key}.hosts", f"item {i}: unknown host {member!r}")
    if len(set(members)) != len(members):
        raise r.fail(f"{key}.hosts", "names a host twice")
    model = body.get("default_model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise r.fail(f"{key}.default_model", "must be a non-empty model name")
    policy = r.one_of(f"{key}.policy", body.get("policy", "priority"), model_.POLICIES)
    all_down = r.one_of(
        f"{key}.when_all_down", body.get("when_all_down", "fail"), model_.WHEN_ALL_DOWN
    )
    listing = r.one_of(
        f"{key}.list_models", body.get("list_models", "forwarded"), model_.LIST_MODELS
    )
    per_key = [r.convert(f"{key}.{k}", parse_optional_count, body.get(k)) for k in _PER_KEY]
    return RouteConfig(
        name,
        tuple(members),
        model,
        cast(model_.Policy, policy),
        cast(model_.WhenAllDown, all_down),
        cast(model_.ListModels, listing),
        r.keys(f"{key}.api_keys", body["api_keys"]) if "api_keys" in body else api_keys,
        _max_load(r, key, body, policy),
        r.convert(f"{key}.queue", parse_flag, body.get("queue", True)),
        r.convert(f"{key}.max_waiting", parse_count, body.get("max_waiting", 256)),
        r.convert(f"{key}.wait_timeout", parse_duration, body.get("wait_timeout", 120)),
        _home_wait(r, key, body, policy),
        per_key[0],
        per_key[1],
        r.convert(f"{key}.spillover", parse_flag, body.get("spillover", False)),
        r.convert(f"{key}.models", parse_model_patterns, body.get("models")),
        r.convert(f"{key}.min_idle_before_evict", parse_idle, body.get("min_idle_before_evict")),
        r.convert(f"{key}.aliases", parse_aliases, body.get("aliases")),
    )


MAX_HOME_WAIT = 60.0
"""Longest ``home_wait``: a short wait for a turn's own host, never a second queue."""


def _home_wait(r: _Reader, key: str, body: dict[str, Any], policy: str) -> float:
    where = f"{key}.home_wait"
    if "home_wait" not in body:
        return model_.HOME_WAIT
    if policy != "cache_affinity":
        raise r.fail(where, "is only for policy cache_affinity")
    value = body["home_wait"]
    if value in (0, "0") or value == "0s":
        return 0.0
    seconds: float = r.convert(where, parse_duration, value)
    if seconds > MAX_HOME_WAIT:
        raise r.fail(where, f"must be at most {MAX_HOME_WAIT:.0f}s, not {value!r}")
    return seconds


def _max_load(r: _Reader, key: str, body: dict[str, Any], policy: str) -> float:
    if "affinity_max_load" not in body:
        return 1.5
    where = f"{key}.affinity_max_load"
    if policy != "cache_affinity":
        raise r.fail(where, "is only for policy cache_affinity")
    value = body["affinity_max_load"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 100:
        raise r.fail(where, f"must be a number from 1 to 100, not {value!r}")
    return float(value)


def _settings(r: _Reader, section: dict[str, Any], key: str, base: HostSettings) -> HostSettings:
    changes = {
        name: r.convert(_join(key, name), SETTING_PARSERS[name], section[name])
        for name in SETTING_KEYS
        if name in section
    }
    return attrs.evolve(base, **changes)

"""Load and check ``crossbar.yaml``.

Every problem becomes one :class:`ConfigError` naming the file, the key as a dotted
path and what is wrong, so that a bad config stops start-up with one readable line
instead of a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import yaml

NAME = re.compile(r"[A-Za-z0-9._-]+")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_RESERVED_ROUTES = frozenset({"_crossbar"})
LISTEN_BACKLOG = 1024
"""Pending connections a bare port accepts: Twisted's default of 50 makes a burst of
agents connecting at once wait a second for the kernel to retry."""
_TCP = re.compile(r"tcp:(?:port=)?(\d+)((?::[a-z]+=[^:]*)*)")


class ConfigError(Exception):
    """A config that cannot be used; ``str()`` is the one line shown to the user."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {problem}")


def _trim_slash(url: str) -> str:
    return url.rstrip("/")


@attrs.frozen
class HostSettings:
    """Per-host timeouts and health rules. Top-level keys of crossbar.yaml set them for
    every host; a host written in mapping form (``{url: ..., max_fails: 3}``) may override."""

    poll_interval: float = 5.0
    poll_timeout: float = 5.0
    health_path: str = "/health"
    connect_timeout: float = 5.0
    header_timeout: float = 900.0
    """Time to the upstream's status line: a router loading a model holds the request."""
    idle_timeout: float = 300.0
    """Longest gap between two chunks of an answer's body."""
    unhealthy_status: frozenset[int] = frozenset()
    """Status codes of real answers that count as failures of the host."""
    unhealthy_latency: float | None = None
    """Time to status line above which a real request counts as a failure."""
    max_fails: int = 1
    """Consecutive failed real requests before the host is marked down."""
    recovery_polls: int = 2
    """Good polls in a row before a host that failed is trusted again."""


SETTING_KEYS = frozenset(attrs.fields_dict(HostSettings))


@attrs.frozen
class HostConfig:
    name: str
    url: str = attrs.field(converter=_trim_slash)
    """Base URL without a trailing slash; a path prefix is kept."""
    settings: HostSettings | None = None
    """This host's own settings; ``None`` takes the config's defaults."""


POLICIES = ("priority", "round_robin", "least_busy")
WHEN_ALL_DOWN = ("fail", "try_all")


@attrs.frozen
class RouteConfig:
    name: str
    hosts: tuple[str, ...]
    default_model: str | None
    policy: str = "priority"
    when_all_down: str = "fail"


@attrs.frozen
class Config:
    listen: str
    """A Twisted server endpoint description."""
    hosts: Mapping[str, HostConfig]
    routes: Mapping[str, RouteConfig]
    defaults: HostSettings = HostSettings()
    source: str = "crossbar.yaml"
    workers: int = 1
    """Processes sharing the listening port (each with its own health table)."""

    def settings(self, host: str) -> HostSettings:
        own = self.hosts[host].settings
        return own if own is not None else self.defaults


def parse_duration(value: object) -> float:
    """Seconds from ``"250ms"``, ``"5s"``, ``"2m"``, ``"1h"`` or a number; must be > 0."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 5s, 2m, 1h)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError(f"not a duration: {value!r}")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"must be more than zero, not {value!r}")
    return seconds


def parse_url(value: object) -> str:
    """Check an ``http(s)://host[:port][/path]`` base URL; return it without a trailing slash."""
    if not isinstance(value, str):
        raise ValueError(f"must be a URL string, not {value!r}")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"not a valid URL: {value!r} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be http(s)://host[:port][/path], not {value!r}")
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise ValueError(f"must have no query or fragment: {value!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    if port == 0:
        raise ValueError(f"port must be 1-65535: {value!r}")
    return value.rstrip("/")


def parse_health_path(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "?" in value or "#" in value:
        raise ValueError(f"must be a path starting with / and without a query: {value!r}")
    if value.rstrip("/") in ("/slots", "/metrics", "/props"):
        raise ValueError(f"{value!r} makes a router load a model; use /health")
    return value


def parse_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a whole number of at least 1, not {value!r}")
    return value


def parse_statuses(value: object) -> frozenset[int]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599 for v in value
    ):
        raise ValueError(f"must be a list of HTTP status codes (100-599), not {value!r}")
    return frozenset(value)


def parse_optional_duration(value: object) -> float | None:
    return None if value is None else parse_duration(value)


_SETTING_PARSERS: dict[str, Any] = {
    "poll_interval": parse_duration,
    "poll_timeout": parse_duration,
    "health_path": parse_health_path,
    "connect_timeout": parse_duration,
    "header_timeout": parse_duration,
    "idle_timeout": parse_duration,
    "unhealthy_status": parse_statuses,
    "unhealthy_latency": parse_optional_duration,
    "max_fails": parse_count,
    "recovery_polls": parse_count,
}


def tcp_address(listen: str) -> tuple[str, int, int]:
    """``(interface, port, backlog)`` of a plain ``tcp:`` endpoint description."""
    match = _TCP.fullmatch(listen)
    if match is None:
        raise ValueError(f"workers need a TCP listen address, not {listen!r}")
    options = dict(part.split("=", 1) for part in match.group(2).split(":") if part)
    unknown = set(options) - {"interface", "backlog"}
    if unknown:
        raise ValueError(f"workers cannot use {', '.join(sorted(unknown))} in {listen!r}")
    backlog = int(options.get("backlog", LISTEN_BACKLOG))
    return options.get("interface", ""), int(match.group(1)), backlog


def parse_workers(value: object) -> int:
    count = parse_count(value)
    if count > 64:
        raise ValueError(f"must be at most 64, not {count}")
    return count


def parse_listen(value: object) -> str:
    """A bare port (all interfaces) or a Twisted server endpoint string."""
    if isinstance(value, bool):
        raise ValueError(f"not a port or endpoint: {value!r}")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int):
        if not 1 <= value <= 65535:
            raise ValueError(f"port must be 1-65535, not {value}")
        return f"tcp:{value}:backlog={LISTEN_BACKLOG}"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"not a port or endpoint: {value!r}")
    from twisted.internet import reactor
    from twisted.internet.endpoints import serverFromString

    try:
        serverFromString(reactor, value)
    except Exception as e:
        raise ValueError(f"not a valid endpoint {value!r}: {e}") from None
    match = re.search(r"^tcp6?:(?:port=)?(\d+)", value)
    if match and not 0 <= int(match.group(1)) <= 65535:
        raise ValueError(f"port must be 1-65535 in {value!r}")
    if match and "backlog=" not in value:
        # Twisted's default of 50 drops connections in a burst (retried only after 1 s).
        value += f":backlog={LISTEN_BACKLOG}"
    return value


class _Reader:
    """Walks the YAML tree and turns every problem into a ConfigError with its key path."""

    def __init__(self, source: str) -> None:
        self.source = source

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

    def convert(self, key: str, parse: Any, value: object) -> Any:
        try:
            return parse(value)
        except ValueError as e:
            raise self.fail(key, str(e)) from None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def parse_config(data: object, source: str = "crossbar.yaml") -> Config:
    """Check a decoded YAML document and build the :class:`Config`."""
    r = _Reader(source)
    if data is None:
        raise r.fail("", "is empty")
    top = r.mapping(data, "", {"listen", "workers", "hosts", "routes"} | SETTING_KEYS)
    for required in ("hosts", "routes"):
        if required not in top:
            raise r.fail(required, "is missing")
    defaults = _settings(r, top, "", HostSettings())

    hosts: dict[str, HostConfig] = {}
    host_map = r.mapping(top["hosts"], "hosts", None)
    if not host_map:
        raise r.fail("hosts", "must name at least one host")
    for name, spec in host_map.items():
        key = f"hosts.{name}"
        r.name(name, key)
        if isinstance(spec, dict):
            entry = r.mapping(spec, key, {"url"} | SETTING_KEYS)
            if "url" not in entry:
                raise r.fail(f"{key}.url", "is missing")
            url = r.convert(f"{key}.url", parse_url, entry["url"])
            own = _settings(r, entry, key, defaults)
            hosts[name] = HostConfig(name, url, own if own != defaults else None)
        else:
            hosts[name] = HostConfig(name=name, url=r.convert(key, parse_url, spec))

    routes: dict[str, RouteConfig] = {}
    route_map = r.mapping(top["routes"], "routes", None)
    if not route_map:
        raise r.fail("routes", "must name at least one route")
    for name, spec in route_map.items():
        key = f"routes.{name}"
        r.name(name, key)
        if name in _RESERVED_ROUTES:
            raise r.fail(key, f"the name {name!r} is reserved for crossbar's own pages")
        body = r.mapping(spec, key, {"hosts", "default_model", "policy", "when_all_down"})
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
        policy = r.one_of(f"{key}.policy", body.get("policy", "priority"), POLICIES)
        all_down = r.one_of(
            f"{key}.when_all_down", body.get("when_all_down", "fail"), WHEN_ALL_DOWN
        )
        routes[name] = RouteConfig(name, tuple(members), model, policy, all_down)

    listen = r.convert("listen", parse_listen, top.get("listen", 7777))
    workers = r.convert("workers", parse_workers, top.get("workers", 1))
    if workers > 1:
        r.convert("listen", tcp_address, listen)
    return Config(
        listen=listen,
        workers=workers,
        hosts=hosts,
        routes=routes,
        defaults=defaults,
        source=source,
    )


def _settings(r: _Reader, section: dict[str, Any], key: str, base: HostSettings) -> HostSettings:
    changes = {
        name: r.convert(_join(key, name), _SETTING_PARSERS[name], section[name])
        for name in SETTING_KEYS
        if name in section
    }
    return attrs.evolve(base, **changes)


def load_config(path: str | Path) -> Config:
    """Read and check a config file; every failure is a :class:`ConfigError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(source, "", f"cannot read: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, "", f"YAML syntax error: {line}{problem}") from None
    return parse_config(data, source)

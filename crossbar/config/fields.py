"""Parsers for the values of crossbar.yaml's keys: each takes what YAML gave and
returns the checked value, or raises ``ValueError`` whose text names the problem."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crossbar.config.model import MEMORY_DB, MIN_IDLE_BEFORE_EVICT
from crossbar.config.secrets import mask_url, shown_url

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TCP = re.compile(r"tcp:(?:port=)?(\d+)((?::[a-z]+=(?:\\.|[^:\\])*)*)")
r"""A plain TCP endpoint; option values may hold colons escaped as Twisted writes them
(``interface=\:\:1``)."""
_UNESCAPED_COLON = re.compile(r"(?<!\\):")
LISTEN_BACKLOG = 1024
"""Pending connections a TCP port accepts: Twisted's default of 50 makes a burst of
agents connecting at once wait a second for the kernel to retry."""


def parse_duration(value: object) -> float:
    """Seconds from ``"250ms"``, ``"5s"``, ``"2m"``, ``"1h"``, ``"90d"`` or a number;
    must be > 0."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value) if abs(value) < 2**1023 else float("inf")  # never OverflowError
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 5s, 2m, 1h, 90d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError(f"not a duration: {value!r}")
    if seconds == float("inf"):
        raise ValueError("is too long")
    if not seconds > 0:
        raise ValueError(f"must be more than zero, not {value!r}")
    return seconds


def parse_url(value: object) -> str:
    """Check an ``http(s)://host[:port][/path]`` base URL; return it without a trailing
    slash. A URL is only ever quoted with what lies before its last ``@`` masked, and
    urllib's own words (which repeat a password that holds ``/``, ``?``, ``#`` or
    ``@``) only for a URL without one. A URL ending in ``/v1`` is refused: crossbar adds
    the API's path, and the host would answer every poll ``404``."""
    if not isinstance(value, str):
        raise ValueError(f"must be a URL string, not {_kind(value)}")
    shown = shown_url(value)
    credentials = "@" in value
    try:
        parts = urlsplit(value)
        port = None if credentials else parts.port
    except ValueError as e:
        why = "" if credentials else f" ({mask_url(str(e))})"
        raise ValueError(f"not a valid URL: {shown!r}{why}") from None
    if parts.scheme in ("http", "https") and credentials:
        raise ValueError(f"must not carry credentials (give the host an api_key): {shown!r}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be http(s)://host[:port][/path], not {shown!r}")
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise ValueError(f"must have no query or fragment: {shown!r}")
    if port == 0:
        raise ValueError(f"port must be 1-65535: {shown!r}")
    if parts.path.rstrip("/").endswith("/v1"):  # a client's base URL, copied: every poll 404s
        base = shown.rstrip("/")[:-3]
        raise ValueError(
            f"host url must not end in /v1: crossbar adds the API path itself; use {base}"
        )
    return value.rstrip("/")


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


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


_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}


def parse_size(value: object) -> int:
    """Bytes from a number or ``"512KiB"``, ``"256MiB"``, ``"1GiB"`` (or KB, MB, GB); > 0."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        size = int(match.group(1)) * _SIZE_UNITS[match.group(2)]
    else:
        raise ValueError(f"not a size: {value!r} (use e.g. 512KiB, 256MiB, 1GiB)")
    if size < 1:
        raise ValueError(f"must be more than zero, not {value!r}")
    return size


def parse_networks(value: object) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A list of addresses or CIDR blocks (``10.0.0.0/8``, ``::1``)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"must be a list of addresses or CIDR blocks, not {_kind(value)}")
    networks = []
    for i, item in enumerate(value):
        try:
            networks.append(ipaddress.ip_network(str(item).strip(), strict=False))
        except ValueError:
            raise ValueError(f"item {i}: not an address or CIDR block: {item!r}") from None
    return tuple(networks)


def parse_usage_db(value: object, base: Path | None) -> str | None:
    """``usage_db``: a file (relative to ``base``, the config's folder), ``":memory:"``,
    or ``off`` (``None``; YAML reads an unquoted ``off`` as false). The file need not
    exist; one that cannot be used is said at start, and crossbar serves without it."""
    if value is False or value == "off":
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a file's path or off, not {_kind(value)}")
    if value == MEMORY_DB:
        return value
    if "\0" in value:
        raise ValueError("must not hold a NUL character")
    try:
        path = Path(value).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        os.fsencode(path)
        folder = path.is_dir()
    except (OSError, RuntimeError, ValueError) as e:  # no such home, too long, not encodable
        raise ValueError(f"cannot be a file's path: {e}") from None
    if folder:
        raise ValueError(f"{path} is a folder, not a file")
    return str(path)


def parse_retention(value: object) -> float:
    """``usage_retention``: a duration of at least an hour (pruning runs hourly)."""
    seconds = parse_duration(value)
    if seconds < 3600:
        raise ValueError(f"must be at least 1h, not {value!r}")
    return seconds


MAX_PATTERN = 256
"""Longest model pattern: a model id is at most 256 bytes."""


def parse_model_patterns(value: object) -> tuple[str, ...]:
    """``models:``: the models allowed, as names or glob patterns (``qwen3-*``,
    ``*/Llama-3*``, ``[ab]-7b``), matched case-sensitively against the model asked for;
    none (``None``): every model."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ValueError(
            "must be a non-empty list of model names or glob patterns (e.g. [qwen3-*]); "
            "leave it out to allow every model"
        )
    for i, pattern in enumerate(value):
        if not isinstance(pattern, str) or not pattern.strip():
            raise ValueError(f"item {i}: must be a model name or a glob pattern, not {pattern!r}")
        if len(pattern) > MAX_PATTERN or not pattern.isprintable():
            raise ValueError(f"item {i}: must be at most {MAX_PATTERN} printable characters")
    return tuple(value)


def parse_aliases(value: object) -> tuple[tuple[str, str], ...]:
    """``aliases:``: glob patterns of the names clients send (``claude-*``), each to the
    model of the fleet it stands for, in the mapping's order (the first that matches
    wins); matched case-sensitively, as ``models:``. None (``None``): no aliases."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise ValueError(
            "must be a mapping of name patterns to models (e.g. {claude-*: qwen3-coder-30b}); "
            "leave it out for none"
        )
    found = []
    for pattern, target in value.items():
        if not isinstance(pattern, str) or not pattern.strip():
            raise ValueError(f"pattern {pattern!r}: must be a model name or a glob pattern")
        if len(pattern) > MAX_PATTERN or not pattern.isprintable():
            problem = f"must be at most {MAX_PATTERN} printable characters"
            raise ValueError(f"pattern {pattern!r}: {problem}")
        if not isinstance(target, str) or not target.strip():
            problem = f"must be the model it stands for, a string, not {target!r}"
            raise ValueError(f"{pattern}: {problem}")
        if len(target) > MAX_PATTERN or not target.isprintable() or _GLOB.search(target):
            problem = f"must be one model's id, not a pattern, at most {MAX_PATTERN} characters"
            raise ValueError(f"{pattern}: {problem}, not {target!r}")
        found.append((pattern, target))
    return tuple(found)


_GLOB = re.compile(r"[*?\[]")
"""What makes a name a pattern: an alias's target is one model, never a pattern."""


def parse_idle(value: object) -> float:
    """``min_idle_before_evict``: a duration that may be zero (``0``, ``0s``: any idle
    model may be evicted); none: :data:`MIN_IDLE_BEFORE_EVICT`."""
    if value is None:
        return MIN_IDLE_BEFORE_EVICT
    return 0.0 if value in (0, "0") or value == "0s" else parse_duration(value)


def parse_optional_duration(value: object) -> float | None:
    return None if value is None else parse_duration(value)


def parse_optional_count(value: object) -> int | None:
    return None if value is None else parse_count(value)


SETTING_PARSERS: dict[str, Any] = {
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
    "models_max": parse_optional_count,
    "prefix_files": parse_count,
}


def tcp_address(listen: str) -> tuple[str, int, int]:
    """``(interface, port, backlog)`` of a plain ``tcp:`` endpoint description."""
    match = _TCP.fullmatch(listen)
    if match is None:
        raise ValueError(f"workers and listen_reuse_port need a plain tcp: port, not {listen!r}")
    parts = _UNESCAPED_COLON.split(match.group(2))
    options = dict(part.replace("\\:", ":").split("=", 1) for part in parts if part)
    unknown = set(options) - {"interface", "backlog"}
    if unknown:
        raise ValueError(f"workers cannot use {', '.join(sorted(unknown))} in {listen!r}")
    backlog = int(options.get("backlog", LISTEN_BACKLOG))
    return options.get("interface", ""), int(match.group(1)), backlog


def parse_flag(value: object) -> bool:
    """``true`` or ``false``, nothing else: a quoted ``"false"`` would read as true."""
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


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
    from twisted.internet.endpoints import serverFromString

    try:
        # Only parsed here: no reactor is needed until crossbar listens.
        serverFromString(None, value)
    except Exception as e:
        raise ValueError(f"{_endpoint_problem(e)} in {value!r}") from None
    match = re.search(r"^tcp6?:(?:port=)?(\d+)", value)
    if match and not 0 <= int(match.group(1)) <= 65535:
        raise ValueError(f"port must be 1-65535 in {value!r}")
    if match and "backlog=" not in value:
        # Twisted's default of 50 drops connections in a burst (retried only after 1 s).
        value += f":backlog={LISTEN_BACKLOG}"
    return value


def _endpoint_problem(e: Exception) -> str:
    """What Twisted's endpoint parser objected to, in words (it raises whatever its
    parsers raise: a TypeError for an unknown option, a ValueError for a bad number)."""
    text = str(e)
    unknown = re.search(r"unexpected keyword argument '([^']*)'", text)
    if unknown:
        return f"unknown option {unknown.group(1)!r}"
    if "Unknown endpoint type" in text:
        return "unknown endpoint type (use tcp:PORT, tcp6:PORT, ssl:PORT:... or unix:PATH)"
    if "invalid literal for int()" in text:
        return "a port must be a number"
    if isinstance(e, OSError) and e.filename:
        return f"cannot read {e.filename}: {(e.strerror or str(e)).lower()}"
    return f"not an endpoint: {text.splitlines()[0] if text else type(e).__name__}"


def shown_listen(listen: str) -> str:
    """A listen endpoint as an admin wrote it: without the backlog crossbar adds."""
    return listen.replace(f":backlog={LISTEN_BACKLOG}", "")


def read_certificates(value: object, base: Path | None) -> tuple[str, bytes]:
    """The PEM file a host's ``tls_ca`` names (relative to the config's folder), read and
    checked now rather than at first use: its path and its bytes."""
    from cryptography.x509 import load_pem_x509_certificates

    if not isinstance(value, str) or not value.strip():
        kind = "nothing" if value is None else type(value).__name__
        raise ValueError(f"must be the path of a PEM file, not {kind}")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        pem = path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {(e.strerror or str(e)).lower()}") from None
    try:
        load_pem_x509_certificates(pem)
    except ValueError:
        raise ValueError(f"{path} holds no PEM certificate") from None
    return str(path), pem

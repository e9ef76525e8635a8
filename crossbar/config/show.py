"""The effective config: what crossbar runs with, every default filled in, keys masked.

``twistd crossbar --check`` prints it so that an admin sees what a file really means
(a host's settings after the top-level ones, a route's keys after the top-level list,
the backlog crossbar adds to ``listen``) before a start or a reload. The YAML it writes
loads again to an equal config, keys aside: a masked key holds a space, so it can never
be taken for a real one by pasting the output back.
"""

from __future__ import annotations

from typing import Any

import attrs
import yaml

from crossbar.config.model import Config, HostConfig, HostSettings, Limits, RouteConfig
from crossbar.config.secrets import MASK, Secret

_HEADER = """\
# The effective config of {source}: every default filled in, keys masked.
# Durations in seconds, sizes in bytes; a route's api_keys are its own or the top-level list.
"""


def effective(config: Config) -> dict[str, Any]:
    """Plain data in crossbar.yaml's shape: every key, every default, no key's value."""
    return {
        "listen": config.listen,
        "listen_reuse_port": config.listen_reuse_port,
        "workers": config.workers,
        "status_listen": config.status_listen,
        "status_keys": [_masked(key) for key in config.status_keys],
        "trusted_proxies": [str(network) for network in config.trusted_proxies],
        "drain_timeout": config.drain_timeout,
        "log_format": config.log_format,
        "usage_db": config.usage_db or False,  # false: off, as crossbar.yaml writes it
        "usage_retention": config.usage_retention,
        "shared_state": None if config.shared_state is None else config.shared_state.shown,
        **_limits(config.limits),
        **_settings(config.defaults),
        "hosts": {name: _host(host, config.settings[name]) for name, host in config.hosts.items()},
        "routes": {name: _route(route) for name, route in config.routes.items()},
    }


def to_yaml(config: Config) -> str:
    """:func:`effective` as YAML that ``load_config`` accepts, under a comment naming it."""
    body = yaml.safe_dump(
        effective(config), sort_keys=False, default_flow_style=None, allow_unicode=True
    )
    return _HEADER.format(source=config.source) + body


def _masked(key: Secret) -> str:
    """``literal (****)`` or ``alice: ${NAME} (****)``: whose it is and where it came from,
    never what it is."""
    shown = f"{key.source} ({MASK})"
    return shown if key.holder is None else f"{key.holder.name}: {shown}"


def _limits(limits: Limits) -> dict[str, Any]:
    # trusted_proxies is the top-level key's, shown there.
    return attrs.asdict(limits, filter=lambda field, _: field.name != "trusted_proxies")


def _settings(settings: HostSettings) -> dict[str, Any]:
    values = attrs.asdict(settings)
    values["unhealthy_status"] = sorted(settings.unhealthy_status)
    return values


def _host(host: HostConfig, settings: HostSettings) -> dict[str, Any]:
    shown: dict[str, Any] = {"url": host.url}
    if host.api_key is not None:
        shown["api_key"] = _masked(host.api_key)
    if host.tls_ca_path is not None:
        shown["tls_ca"] = host.tls_ca_path
    if host.slots is not None:
        shown["slots"] = host.slots
    return shown | _settings(settings)


def _route(route: RouteConfig) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "hosts": list(route.hosts),
        "default_model": route.default_model,
        "policy": route.policy,
    }
    if route.policy == "cache_affinity":
        # Refused by the loader under any other policy.
        shown["affinity_max_load"] = route.affinity_max_load
        shown["home_wait"] = route.home_wait
    return shown | {
        "when_all_down": route.when_all_down,
        "list_models": route.list_models,
        "api_keys": [_masked(key) for key in route.api_keys],
        "queue": route.queue,
        "max_waiting": route.max_waiting,
        "max_waiting_per_key": route.max_waiting_per_key,
        "max_in_flight_per_key": route.max_in_flight_per_key,
        "wait_timeout": route.wait_timeout,
        "spillover": route.spillover,
        "models": list(route.models) or None,  # none: every model
        "min_idle_before_evict": route.min_idle_before_evict,
        "aliases": dict(route.aliases) or None,  # none: no aliases
    }

"""crossbar.yaml: the checked configuration, and the loader that checks it."""

from crossbar.config.changes import Changes, Reloaded, Reloads, compare, moved
from crossbar.config.fields import (
    LISTEN_BACKLOG,
    parse_duration,
    parse_listen,
    shown_listen,
    tcp_address,
)
from crossbar.config.load import ConfigError, parse_config
from crossbar.config.model import (
    DEMO_SOURCE,
    MEMORY_DB,
    POLICIES,
    WHEN_ALL_DOWN,
    Config,
    HostConfig,
    HostSettings,
    Limits,
    Network,
    Policy,
    RouteConfig,
    WhenAllDown,
)
from crossbar.config.secrets import PRIORITIES, KeyHolder, Secret, key_held, mask_url, matching
from crossbar.config.sharedstate import SharedState
from crossbar.config.show import effective, to_yaml
from crossbar.config.yamlfile import load_config

__all__ = [
    "DEMO_SOURCE",
    "LISTEN_BACKLOG",
    "MEMORY_DB",
    "POLICIES",
    "PRIORITIES",
    "WHEN_ALL_DOWN",
    "Changes",
    "Config",
    "ConfigError",
    "HostConfig",
    "HostSettings",
    "KeyHolder",
    "Limits",
    "Network",
    "Policy",
    "Reloaded",
    "Reloads",
    "RouteConfig",
    "Secret",
    "SharedState",
    "WhenAllDown",
    "compare",
    "effective",
    "key_held",
    "load_config",
    "mask_url",
    "matching",
    "moved",
    "parse_config",
    "parse_duration",
    "parse_listen",
    "shown_listen",
    "tcp_address",
    "to_yaml",
]

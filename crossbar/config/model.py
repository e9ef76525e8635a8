"""What a checked ``crossbar.yaml`` says, as frozen attrs values.

Nothing here reads files or talks to the network: the loader builds these, and every
other part of crossbar only reads them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Literal, get_args

import attrs

from crossbar.config.secrets import Secret
from crossbar.config.sharedstate import SharedState

Policy = Literal["priority", "round_robin", "least_busy", "cache_affinity"]
"""How a route picks among the hosts of its best group."""
WhenAllDown = Literal["fail", "try_all"]
"""What a route does when none of its hosts is healthy."""
ListModels = Literal["forwarded", "merged"]
"""Who answers ``GET /<route>/v1/models``: the chosen host, or crossbar for all of them."""
LogFormat = Literal["text", "json"]
"""crossbar's own log lines as text, or one JSON object each."""
LIST_MODELS: tuple[str, ...] = get_args(ListModels)
POLICIES: tuple[str, ...] = get_args(Policy)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
USAGE_DB_FILE = "crossbar-usage.sqlite3"
"""``usage_db``'s default: this file beside the config file."""
MEMORY_DB = ":memory:"
"""``usage_db: ":memory:"``: kept in memory, for a demo or a trial (SQLite's own name)."""
DEMO_SOURCE = "(demo)"
"""The ``source`` of the config ``--demo`` makes: no file, a simulated fleet."""
WHEN_ALL_DOWN: tuple[str, ...] = get_args(WhenAllDown)


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
    models_max: int | None = None
    """Models a router host runs at once (its ``--models-max``); ``None``: what the
    router's own ``GET /props`` says (``max_instances``), else unknown."""
    prefix_files: int = 8
    """Shared prompt prefixes kept saved on the host (``--slot-save-path``), one file each:
    the bound of the disk crossbar uses there (:mod:`crossbar.prefixes`)."""


SETTING_KEYS = frozenset(attrs.fields_dict(HostSettings))


@attrs.frozen
class HostConfig:
    name: str
    url: str = attrs.field(converter=_trim_slash)
    """Base URL without a trailing slash; a path prefix is kept."""
    settings: HostSettings | None = None
    """This host's own settings; ``None`` takes the config's defaults."""
    api_key: Secret | None = None
    """Sent as ``Authorization: Bearer`` on every request and poll to this host."""
    tls_ca: bytes | None = None
    """PEM certificates that an ``https://`` host's certificate must chain to, instead
    of the system's CAs (a lab's own CA)."""
    tls_ca_path: str | None = None
    """Where ``tls_ca`` was read from, for messages."""
    slots: int | None = None
    """Requests the host serves at once (its ``-np``), when known: ``cache_affinity``
    keeps the conversations it holds within what its slots can keep cached."""


HOME_WAIT = 5.0
"""The default ``home_wait``: a move costs the prefill of the whole conversation, seconds
for an agent's; a busy host frees a slot within a few (``benchmarks/home_wait.py``)."""


MIN_IDLE_BEFORE_EVICT = 30.0
"""The default ``min_idle_before_evict``: an agent thinks between turns for seconds to
tens of seconds; a model evicted meanwhile costs it a reload and its prompt cache."""


@attrs.frozen
class RouteConfig:
    name: str
    hosts: tuple[str, ...]
    default_model: str | None
    policy: Policy = "priority"
    when_all_down: WhenAllDown = "fail"
    list_models: ListModels = "forwarded"
    api_keys: tuple[Secret, ...] = ()
    """Keys a client must offer to use this route (its own list, else the top-level
    one); empty means the route is open."""
    affinity_max_load: float = 1.5
    """``cache_affinity``: a conversation leaves its home host only when that host has
    more requests in flight than this times the group's average (and 2 more than the
    least busy)."""
    queue: bool = True
    """Requests wait in crossbar when every host of their group has all its slots busy
    (where slots are known); ``False``: sent on at once, for the host to queue."""
    max_waiting: int = 256
    """Requests of this route waiting in crossbar at once (every model, every host); when
    full, the newest of the key or client holding the most places gives way to one
    holding fewer, else the newcomer is answered 429."""
    wait_timeout: float = 120.0
    """Seconds a request may wait in crossbar for a slot; then it is answered 429."""
    home_wait: float = HOME_WAIT
    """``cache_affinity``: seconds a turn whose host (where its conversation's prompt is
    cached) has every slot busy waits for a slot there before it takes another host's
    (0: sent on at once, as before). Moving prefills the whole conversation again."""
    max_waiting_per_key: int | None = None
    """Requests of one key waiting at once, for a key without a ``max_waiting`` of its own
    (an unnamed key too); ``None``: no limit but the route's."""
    max_in_flight_per_key: int | None = None
    """Requests of one key sent to hosts at once (more wait, even with a slot free), for a
    key without a ``max_in_flight`` of its own; ``None``: no limit. A key's requests are
    counted across routes, against the limit of the route each comes on."""
    spillover: bool = False
    """When every host with the model loaded has all its slots busy and a request would
    wait, start one more copy where it is cheapest (a free instance or an idle model to
    evict), one load at a time per model."""
    models: tuple[str, ...] = ()
    """Glob patterns of the models this route serves; a request for another is answered
    403. Empty: every model."""
    min_idle_before_evict: float = MIN_IDLE_BEFORE_EVICT
    """Seconds a model must have had no request before placement may evict it to load
    another (0: any idle model may go)."""
    aliases: tuple[tuple[str, str], ...] = ()
    """``(pattern, model)``: a request naming a model no host of the route lists, that
    matches the glob ``pattern`` (case-sensitive), is for ``model``; the first that
    matches wins (:func:`crossbar.routing.aliases.real_model`)."""


def _resolve(config: Config) -> Mapping[str, HostSettings]:
    return {
        name: host.settings if host.settings is not None else config.defaults
        for name, host in config.hosts.items()
    }


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@attrs.frozen
class Limits:
    """What one client, or all of them together, may hold of crossbar."""

    head_timeout: float = 30.0
    """Seconds from a request's first byte to the end of its headers (slowloris)."""
    body_timeout: float = 60.0
    """Seconds from a request's headers to the end of its body."""
    max_connections: int = 2048
    """Client connections open at once; past it the oldest idle one is closed to make
    room, or (none idle) the new one is closed at once."""
    max_connections_per_client: int = attrs.field(
        default=attrs.Factory(lambda limits: max(1, limits.max_connections // 4), takes_self=True)
    )
    """Client connections open at once from one address (an IPv6 client: its /64), so
    that one machine cannot take them all; a quarter of ``max_connections`` unless set."""
    max_body_memory: int = 256 * 1024 * 1024
    """Bytes of request bodies held at once across all clients."""
    max_body: int = 16 * 1024 * 1024
    """Bytes of one request's body."""
    trusted_proxies: tuple[Network, ...] = attrs.field(default=(), eq=False, repr=False)
    """Peers with no share of their own: many clients come through each. Not a key of
    its own: always the config's ``trusted_proxies`` (see :class:`Config`)."""


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
    listen_reuse_port: bool = False
    """Bind ``listen`` (and ``status_listen``) with ``SO_REUSEPORT``, so that a new crossbar
    can open the same port while this one drains (an upgrade with no refused connection)."""
    limits: Limits = Limits()
    status_keys: tuple[Secret, ...] = ()
    """Keys for ``/_crossbar/`` (all but ``livez`` and ``readyz``); empty: any route's key
    when a route has keys, else open."""
    status_listen: str | None = None
    """An endpoint of its own for the status pages; the main port then serves only
    ``livez`` and ``readyz`` under ``/_crossbar/``."""
    drain_timeout: float = 30.0
    """Seconds a stopping crossbar lets requests in flight finish before closing them."""
    log_format: LogFormat = "text"
    """crossbar's own log lines as text for people, or one JSON object each for machines."""
    trusted_proxies: tuple[Network, ...] = ()
    """Peers whose ``X-Forwarded-For`` is extended; anyone else's is replaced."""
    usage_db: str | None = None
    """The SQLite file usage is kept in, across restarts (:data:`MEMORY_DB`: in memory,
    lost at exit); ``None``: not kept. A config file's default is a file beside it."""
    usage_retention: float = 90 * 86400.0
    """Seconds usage is kept in ``usage_db`` before it is pruned."""
    shared_state: SharedState | None = None
    """The store replicas share one count of the slots through; ``None``: each counts its own."""
    settings: Mapping[str, HostSettings] = attrs.field(
        init=False, default=attrs.Factory(_resolve, takes_self=True), eq=False
    )
    """Every host's settings, its own or the defaults: resolved once, read everywhere."""

    def __attrs_post_init__(self) -> None:
        # The sites see only the limits: they carry the proxies exempt from the share.
        if self.limits.trusted_proxies != self.trusted_proxies:
            limits = attrs.evolve(self.limits, trusted_proxies=self.trusted_proxies)
            object.__setattr__(self, "limits", limits)

    @property
    def urls(self) -> dict[str, str]:
        """Host name -> base URL."""
        return {name: host.url for name, host in self.hosts.items()}

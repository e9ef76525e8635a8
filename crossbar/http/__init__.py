"""The HTTP side: twisted.web made fit for a proxy on a shared network. Sites, requests
admitted or refused on their head, keys, client connections and their caps, listening,
draining, timers."""

from crossbar.http.drain import count_requests, drain
from crossbar.http.errors import error_payload, too_long_payload
from crossbar.http.headers import (
    BODYLESS,
    BadTarget,
    RoutePath,
    answer_headers,
    host_keys,
    parse_target,
    trusted_proxy,
    upstream_headers,
)
from crossbar.http.keys import KeyGuard, Pages, Peers
from crossbar.http.listener import (
    INTERNAL_LISTENER,
    CannotListen,
    Listener,
    ReusePortEndpoint,
    not_an_internal_start,
)
from crossbar.http.request import (
    ProxyRequest,
    answer_json,
    lender_of,
    release_body,
    stopping,
    when_over,
)
from crossbar.http.site import Channel, Site
from crossbar.http.timers import SPENT, Deadline, borrow, give_back, stop

__all__ = [
    "BODYLESS",
    "INTERNAL_LISTENER",
    "SPENT",
    "BadTarget",
    "CannotListen",
    "Channel",
    "Deadline",
    "KeyGuard",
    "Listener",
    "Pages",
    "Peers",
    "ProxyRequest",
    "ReusePortEndpoint",
    "RoutePath",
    "Site",
    "answer_headers",
    "answer_json",
    "borrow",
    "count_requests",
    "drain",
    "error_payload",
    "give_back",
    "host_keys",
    "lender_of",
    "not_an_internal_start",
    "parse_target",
    "release_body",
    "stop",
    "stopping",
    "too_long_payload",
    "trusted_proxy",
    "upstream_headers",
    "when_over",
]

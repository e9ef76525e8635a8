"""crossbar's client side: how it connects to its hosts, sends a request and reads
the answer (parsed by llhttp through :mod:`crossbar.upstream.parsing`), and the words
for the ways that can fail."""

from crossbar.upstream.call import Answerer, Call
from crossbar.upstream.connection import Response
from crossbar.upstream.endpoints import (
    IDLE_POOL_TIMEOUT,
    HostAddress,
    endpoint_for,
    make_agent,
    make_agents,
    make_pool,
)
from crossbar.upstream.failures import Discard, describe, is_cancellation, stop_producing
from crossbar.upstream.pool import Upstreams

__all__ = [
    "IDLE_POOL_TIMEOUT",
    "Answerer",
    "Call",
    "Discard",
    "HostAddress",
    "Response",
    "Upstreams",
    "describe",
    "endpoint_for",
    "is_cancellation",
    "make_agent",
    "make_agents",
    "make_pool",
    "stop_producing",
]

"""The proxy exchange: one request read (its API's shape, model and conversation), sent to
a host, its answer relayed back, and its outcome recorded."""

from crossbar.proxy.context import PlacementsTold, ProxyContext
from crossbar.proxy.resources import ProxyResource, RootResource

__all__ = [
    "PlacementsTold",
    "ProxyContext",
    "ProxyResource",
    "RootResource",
]

"""Polling: what crossbar learns of its hosts (``GET /health``, ``GET /v1/models``, slots
and room from ``/props``) and the health table it keeps, on a ``LoopingCall`` per host."""

from crossbar.polling.health import Clock, HealthTable, HostState
from crossbar.polling.listreader import ListReader
from crossbar.polling.loadfailures import LOOKED_AT, failed_load
from crossbar.polling.modellist import MAX_LISTING_BYTES, merged_listing, with_windows
from crossbar.polling.poller import Poller

__all__ = [
    "LOOKED_AT",
    "MAX_LISTING_BYTES",
    "Clock",
    "HealthTable",
    "HostState",
    "ListReader",
    "Poller",
    "failed_load",
    "merged_listing",
    "with_windows",
]

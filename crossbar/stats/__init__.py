"""Stats: one record per finished request, and what is made of it: the last five minutes,
the last hour, the access log and the Prometheus metrics."""

from crossbar.stats.accessline import ALIAS_CHARS, printable
from crossbar.stats.accesslog import AccessLog
from crossbar.stats.hour import MINUTES, HostHour, HourlyTraffic
from crossbar.stats.metrics import CONTENT_TYPE, Metrics, merge_workers
from crossbar.stats.queuemetrics import waiting_by_route
from crossbar.stats.record import Observers, ProxyObserver, RequestRecord, refused_record
from crossbar.stats.window import WINDOW_SECONDS, HostRecent, RecentTraffic, RouteAffinity

__all__ = [
    "ALIAS_CHARS",
    "CONTENT_TYPE",
    "MINUTES",
    "WINDOW_SECONDS",
    "AccessLog",
    "HostHour",
    "HostRecent",
    "HourlyTraffic",
    "Metrics",
    "Observers",
    "ProxyObserver",
    "RecentTraffic",
    "RequestRecord",
    "RouteAffinity",
    "merge_workers",
    "printable",
    "refused_record",
    "waiting_by_route",
]

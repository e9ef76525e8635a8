"""The fleet: what crossbar knows of its hosts, how it learns it, and how it chooses."""

from crossbar.fleet.choice import choose, choose_for_route, routes_down
from crossbar.fleet.listing import merged_listing, parse_models
from crossbar.fleet.recent import HostRecent, RecentTraffic
from crossbar.fleet.state import HealthTable, HostState
from crossbar.fleet.traffic import Observers, Outcome, ProxyObserver, Traffic

__all__ = [
    "HealthTable",
    "HostRecent",
    "HostState",
    "Observers",
    "Outcome",
    "ProxyObserver",
    "RecentTraffic",
    "Traffic",
    "choose",
    "choose_for_route",
    "merged_listing",
    "parse_models",
    "routes_down",
]

"""The fleet: what crossbar knows of its hosts, how it learns it, and how it chooses."""

from crossbar.fleet.affinity import AffinityOutcome, Conversations, Placement
from crossbar.fleet.choice import best_group, choose, choose_for_route, place, routes_down
from crossbar.fleet.listing import merged_listing, parse_models
from crossbar.fleet.recent import HostRecent, RecentTraffic, RouteAffinity
from crossbar.fleet.state import HealthTable, HostState
from crossbar.fleet.traffic import Observers, Outcome, ProxyObserver, Traffic

__all__ = [
    "AffinityOutcome",
    "Conversations",
    "HealthTable",
    "HostRecent",
    "HostState",
    "Observers",
    "Outcome",
    "Placement",
    "ProxyObserver",
    "RecentTraffic",
    "RouteAffinity",
    "Traffic",
    "best_group",
    "choose",
    "choose_for_route",
    "merged_listing",
    "parse_models",
    "place",
    "routes_down",
]

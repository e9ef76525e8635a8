"""The fleet: what crossbar knows of its hosts, how it learns it, and how it chooses."""

from crossbar.fleet.affinity import AffinityOutcome, Conversations, Placement
from crossbar.fleet.choice import best_group, routes_down
from crossbar.fleet.hourly import HostHour, HourlyTraffic
from crossbar.fleet.listing import merged_listing, parse_models
from crossbar.fleet.policies import Ask, Choice, Conversation, Policies, Policy
from crossbar.fleet.recent import HostRecent, RecentTraffic, RouteAffinity
from crossbar.fleet.record import Observers, ProxyObserver, RequestRecord
from crossbar.fleet.state import HealthTable, HostState
from crossbar.fleet.traffic import Traffic

__all__ = [
    "AffinityOutcome",
    "Ask",
    "Choice",
    "Conversation",
    "Conversations",
    "HealthTable",
    "HostHour",
    "HostRecent",
    "HostState",
    "HourlyTraffic",
    "Observers",
    "Placement",
    "Policies",
    "Policy",
    "ProxyObserver",
    "RecentTraffic",
    "RequestRecord",
    "RouteAffinity",
    "Traffic",
    "best_group",
    "merged_listing",
    "parse_models",
    "routes_down",
]

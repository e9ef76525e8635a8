"""Routing: which host serves a request. Groups, the route's policy (``priority``,
``round_robin``, ``least_busy``, ``cache_affinity``), a conversation's home, and where a
model is loaded, and which hosts a request fits. Pure rules, no I/O."""

from crossbar.routing.affinity import Conversations, Placement
from crossbar.routing.aliases import real_model
from crossbar.routing.allowance import LoadBudget, allows, refused_model
from crossbar.routing.conversationtable import KEY_BYTES, LIVE_SECONDS
from crossbar.routing.fit import REPLY_MARGIN, fits_nowhere, largest_window, too_small
from crossbar.routing.groups import best_group, no_healthy_host, routes_down, served_model
from crossbar.routing.placement import (
    BUSY,
    EVICTS,
    FAILED,
    FREE,
    LOADING,
    NO_AUTOLOAD,
    RECENT,
    LoadCost,
    Occupancy,
    spill_places,
)
from crossbar.routing.policies import Ask, CacheAffinity, Choice, Conversation, places_conversations
from crossbar.routing.promptsize import Estimate, PromptSizes
from crossbar.routing.rendezvous import rendezvous
from crossbar.routing.sharedplacements import OutgoingPlacements, Placed, read_placed

__all__ = [
    "BUSY",
    "EVICTS",
    "FAILED",
    "FREE",
    "KEY_BYTES",
    "LIVE_SECONDS",
    "LOADING",
    "NO_AUTOLOAD",
    "RECENT",
    "REPLY_MARGIN",
    "Ask",
    "CacheAffinity",
    "Choice",
    "Conversation",
    "Conversations",
    "Estimate",
    "LoadBudget",
    "LoadCost",
    "Occupancy",
    "OutgoingPlacements",
    "Placed",
    "Placement",
    "PromptSizes",
    "allows",
    "best_group",
    "fits_nowhere",
    "largest_window",
    "no_healthy_host",
    "places_conversations",
    "read_placed",
    "real_model",
    "refused_model",
    "rendezvous",
    "routes_down",
    "served_model",
    "spill_places",
    "too_small",
]

"""Queueing: requests that wait in crossbar for a slot, the flows they belong to, and which
one is sent when a slot frees (fair between flows, by band)."""

from crossbar.queueing.answers import Go, Queued, SlotShare, Waiter
from crossbar.queueing.flows import client_group, flow_of
from crossbar.queueing.lanes import Head
from crossbar.queueing.queue import Flow, Refused, Waiting
from crossbar.queueing.slotuse import WINDOW_SECONDS, SlotUse
from crossbar.queueing.traffic import Traffic
from crossbar.queueing.waits import Waits

__all__ = [
    "WINDOW_SECONDS",
    "Flow",
    "Go",
    "Head",
    "Queued",
    "Refused",
    "SlotShare",
    "SlotUse",
    "Traffic",
    "Waiter",
    "Waiting",
    "Waits",
    "client_group",
    "flow_of",
]

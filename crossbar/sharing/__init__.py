"""Sharing: one count of the fleet's slots for every worker (``workers: N``), kept by
worker 0, so that the queue's promise holds across processes: a host is sent a request only
when a slot is free in the fleet's count, and a freed slot goes to the request waiting
first in any worker."""

from crossbar.sharing.ledger import LEASE, SlotLedger
from crossbar.sharing.links import joining, keeping
from crossbar.sharing.member import Member

__all__ = ["LEASE", "Member", "SlotLedger", "joining", "keeping"]

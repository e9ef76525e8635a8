"""Sharing: one count of the fleet's slots for every process, so that the queue's promise
holds across them: a host is sent a request only when a slot is free in the fleet's count,
and a freed slot goes to the request waiting first in any process. Workers of one crossbar
(``workers: N``) share worker 0's count; replicas on several machines (``shared_state``)
share a Redis store's."""

from crossbar.sharing.ledger import LEASE, SlotLedger
from crossbar.sharing.links import joining, keeping
from crossbar.sharing.member import Member
from crossbar.sharing.placesync import PlacementSync
from crossbar.sharing.storelink import storing

__all__ = ["LEASE", "Member", "PlacementSync", "SlotLedger", "joining", "keeping", "storing"]

"""Usage: the tokens and timings each answer reports, read as it streams by, and kept
across restarts in a SQLite store, summed per minute."""

from crossbar.usage.counts import Bounds
from crossbar.usage.ledger import UsageLedger
from crossbar.usage.queries import QueriesBusy, UsageQueries
from crossbar.usage.reader import APIS, AnswerReader
from crossbar.usage.store import GROUPS, UsageStore
from crossbar.usage.sums import COUNTS
from crossbar.usage.thread import OneThread

__all__ = [
    "APIS",
    "COUNTS",
    "GROUPS",
    "AnswerReader",
    "Bounds",
    "OneThread",
    "QueriesBusy",
    "UsageLedger",
    "UsageQueries",
    "UsageStore",
]

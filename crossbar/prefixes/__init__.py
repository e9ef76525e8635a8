"""Shared prompt prefixes (an agent's system prompt and tools): counted per route and
model, saved once on each host that allows slot saves, and restored into a free slot
before a new conversation's first turn there."""

from crossbar.prefixes.counts import PrefixCounts
from crossbar.prefixes.keeper import PrefixKeeper
from crossbar.prefixes.saves import PrefixSaves

__all__ = ["PrefixCounts", "PrefixKeeper", "PrefixSaves"]

"""The orders every crossbar replica computes alike from a conversation's key alone: its
hosts by rendezvous weight (its home first), and its rank among conversations, by which
ranked conversations take slots (:mod:`crossbar.routing.affinity` decides when).

BLAKE2b digests, never Python's ``hash()`` (salted per process). Pure rules, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from hashlib import blake2b


def weight(key: bytes, host: str) -> bytes:
    """The host's weight for the conversation: compared as bytes, the same everywhere."""
    return blake2b(key + host.encode(), digest_size=8).digest()


def rendezvous(key: bytes, hosts: Sequence[str]) -> list[str]:
    """``hosts`` in the conversation's order of preference: its home first."""
    return sorted(hosts, key=lambda host: (weight(key, host), host), reverse=True)


def rank(key: bytes) -> bytes:
    """The conversation's place in the order ranked conversations take slots in."""
    return blake2b(key + b"\x00rank", digest_size=8).digest()


def ranked_hosts(
    keys: Iterable[bytes], group: Sequence[str], slots: Mapping[str, int]
) -> dict[bytes, str]:
    """Where each of ``keys`` goes when, in :func:`rank` order, each takes its first host
    by weight with a slot left (its home when none has): a function of the set alone."""
    taken = dict.fromkeys(group, 0)
    placed = {}
    for key in sorted(keys, key=rank, reverse=True):
        placed[key] = take_slot(key, group, slots, taken)
    return placed


def take_slot(
    key: bytes, group: Sequence[str], slots: Mapping[str, int], taken: dict[str, int]
) -> str:
    """The first host by weight with a slot left after ``taken`` (its home when none has;
    a host without ``slots`` always has one), counted in ``taken``."""
    order = rendezvous(key, group)
    host = next((h for h in order if h not in slots or taken[h] < slots[h]), order[0])
    taken[host] += 1
    return host

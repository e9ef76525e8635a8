"""The phases of one proxied request (:class:`crossbar.proxy.exchange.Exchange`), and the
moves between them::

    CHOOSING -> WAITING -> STREAMING -> ANSWERED | CUT_OFF
     |  ^  ^       |
     |  |  +-------+  (failover: the host failed before any answer)
     v  |
    QUEUED            (every slot of its group busy: it waits in crossbar, then is sent)

and from any phase not yet ended to ``ANSWERED`` (an answer made here: an error, a merged
model list) or ``CLIENT_LEFT``. Pure values, no I/O.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Where an exchange stands."""

    __hash__ = object.__hash__  # a member is its own identity: hashed in C, not by name

    CHOOSING = "choosing a host"
    """Reading the request and choosing a host (again, after a failure before any answer)."""
    QUEUED = "waiting for a slot"
    """Every slot of its group is busy: it waits in crossbar (:mod:`crossbar.queueing.waits`)."""
    WAITING = "waiting for the host's head"
    """Sent to a host (connecting included); no status line yet."""
    STREAMING = "streaming the answer"
    """The host's status line came; its body is relayed as it arrives."""
    ANSWERED = "answered"
    """Ended: the answer was relayed whole, or crossbar answered itself."""
    CUT_OFF = "cut off"
    """Ended: the answer had begun and was cut off (host broke off or went quiet)."""
    CLIENT_LEFT = "client left"
    """Ended: the client went away (or read nothing for ``idle_timeout``) first."""


ENDED = frozenset({Phase.ANSWERED, Phase.CUT_OFF, Phase.CLIENT_LEFT})
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.CHOOSING: frozenset({Phase.WAITING, Phase.QUEUED, Phase.ANSWERED, Phase.CLIENT_LEFT}),
    Phase.QUEUED: frozenset({Phase.CHOOSING, Phase.ANSWERED, Phase.CLIENT_LEFT}),
    Phase.WAITING: frozenset({Phase.CHOOSING, Phase.STREAMING, Phase.ANSWERED, Phase.CLIENT_LEFT}),
    Phase.STREAMING: ENDED,
}
"""The moves an exchange may make; an ended one makes none."""

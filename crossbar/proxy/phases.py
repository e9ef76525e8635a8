"""The phases of one proxied request (:class:`crossbar.proxy.exchange.Exchange`), the
events that move it, and the table of moves: ``MOVES[phase][event]`` is the phase the
event leads to, as h11's ``_state.py`` keys its own. An event the table does not list for
a live phase is a bug (:class:`ImpossibleEvent`); an ended exchange takes no more events
(a late one changes nothing). ``python -m crossbar.proxy.phases`` prints the table as a
Mermaid diagram (``docs/architecture.md`` shows it). Pure values, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Phase(enum.Enum):
    """Where an exchange stands."""

    CHOOSING = "choosing a host"
    """Reading the request and choosing a host (again, after a failure before any answer)."""
    QUEUED = "waiting for a slot"
    """Every slot of its group is busy: it waits in crossbar (:mod:`crossbar.queueing.waits`)."""
    WAITING = "waiting for the host's head"
    """Sent to a host (connecting included; a saved prefix restored there first,
    :mod:`crossbar.prefixes`); no status line yet."""
    HOLDING = "reading what may be a refusal"
    """The host's head is a short ``400``: its body is read whole before anything reaches
    the client, for it may refuse a prompt too long for the host's window
    (:mod:`crossbar.proxy.overflow`); then tried elsewhere, answered, or relayed. A host's
    own model list (a forwarded ``GET /v1/models``) is read whole here too, to be answered
    with the windows crossbar knows added."""
    OPENING = "waiting for the answer's first content"
    """The host's head came, but nothing a client parses has reached the client: the head
    and SSE comments may go out to keep its connection alive, and a host that fails now
    (a break, a ``5xx``, an error event) is still tried on another
    (:class:`~crossbar.proxy.relay.FirstContent`)."""
    STREAMING = "streaming the answer"
    """The answer's first content reached the client; its body is relayed as it arrives,
    and nothing is retried."""
    ANSWERED = "answered"
    """Ended: the answer was relayed whole, or crossbar answered itself."""
    CUT_OFF = "cut off"
    """Ended: the answer had begun and was cut off (host broke off or went quiet)."""
    CLIENT_LEFT = "client left"
    """Ended: the client went away (or read nothing for ``idle_timeout``) first."""


class Event(enum.Enum):
    """What happens to an exchange."""

    CHOSEN = "a host was chosen and the request sent to it"
    QUEUED = "every slot of its group is busy: it waits in crossbar"
    DISPATCHED = "a slot of its group freed: on to choosing among the hosts with room"
    REFUSED = "the queue answered it: a limit, a wait past wait_timeout, crossbar stopping"
    HOST_FAILED = (
        "the host failed before any content (no head, a break, a 5xx, an error event), or"
        " refused the prompt as too long for its window: another host is tried"
    )
    LOAD_FAILED = "the host answered that it failed to load the model: on to another, or waits"
    HEAD_RECEIVED = "the host's status line and headers came"
    HEAD_HELD = "the host's head is a short 400: its body is read before any of it is relayed"
    CONTENT = "the answer's first content went to the client: from now on nothing is retried"
    BODY_ENDED = "the host's body ended whole"
    BODY_BROKEN = "the answer had begun and broke off (or went quiet, or crossbar stopped)"
    TIMED_OUT = "no head within header_timeout, or no chunk before any was sent: a 504"
    ANSWERED_HERE = "crossbar answered itself: an error, or the merged model list"
    CLIENT_LEFT = "the client went away, or read nothing for idle_timeout"


ENDED = frozenset({Phase.ANSWERED, Phase.CUT_OFF, Phase.CLIENT_LEFT})

MOVES: Mapping[Phase, Mapping[Event, Phase]] = {
    Phase.CHOOSING: {
        Event.CHOSEN: Phase.WAITING,
        Event.QUEUED: Phase.QUEUED,
        Event.REFUSED: Phase.ANSWERED,
        Event.ANSWERED_HERE: Phase.ANSWERED,
        Event.CLIENT_LEFT: Phase.CLIENT_LEFT,
    },
    Phase.QUEUED: {
        Event.DISPATCHED: Phase.CHOOSING,
        Event.REFUSED: Phase.ANSWERED,
        Event.ANSWERED_HERE: Phase.ANSWERED,
        Event.CLIENT_LEFT: Phase.CLIENT_LEFT,
    },
    Phase.WAITING: {
        Event.HOST_FAILED: Phase.CHOOSING,
        Event.HEAD_RECEIVED: Phase.OPENING,
        Event.HEAD_HELD: Phase.HOLDING,
        Event.TIMED_OUT: Phase.ANSWERED,
        Event.ANSWERED_HERE: Phase.ANSWERED,
        Event.CLIENT_LEFT: Phase.CLIENT_LEFT,
    },
    Phase.HOLDING: {
        Event.HOST_FAILED: Phase.CHOOSING,
        Event.HEAD_RECEIVED: Phase.OPENING,
        Event.TIMED_OUT: Phase.ANSWERED,
        Event.ANSWERED_HERE: Phase.ANSWERED,
        Event.CLIENT_LEFT: Phase.CLIENT_LEFT,
    },
    Phase.OPENING: {
        Event.HOST_FAILED: Phase.CHOOSING,
        Event.LOAD_FAILED: Phase.CHOOSING,
        Event.CONTENT: Phase.STREAMING,
        Event.BODY_BROKEN: Phase.CUT_OFF,
        Event.TIMED_OUT: Phase.ANSWERED,
        Event.ANSWERED_HERE: Phase.ANSWERED,
        Event.CLIENT_LEFT: Phase.CLIENT_LEFT,
    },
    Phase.STREAMING: {
        Event.BODY_ENDED: Phase.ANSWERED,
        Event.BODY_BROKEN: Phase.CUT_OFF,
        Event.TIMED_OUT: Phase.ANSWERED,
        Event.ANSWERED_HERE: Phase.ANSWERED,
        Event.CLIENT_LEFT: Phase.CLIENT_LEFT,
    },
    Phase.ANSWERED: {},
    Phase.CUT_OFF: {},
    Phase.CLIENT_LEFT: {},
}
"""Each phase's events, and the phase each leads to; an ended phase has none."""


class ImpossibleEvent(Exception):
    """An event the table does not list for the phase an exchange is in: a bug."""

    def __init__(self, phase: Phase, event: Event) -> None:
        super().__init__(f"event {event.name} cannot happen in phase {phase.name}")
        self.phase, self.event = phase, event


def next_phase(phase: Phase, event: Event) -> Phase | None:
    """The phase ``event`` leads to from ``phase``; ``None`` for an ended exchange (a late
    event changes nothing). Raises :class:`ImpossibleEvent` for a move not in the table."""
    if phase in ENDED:
        return None
    after = MOVES[phase].get(event)
    if after is None:
        raise ImpossibleEvent(phase, event)
    return after


def diagram() -> str:
    """:data:`MOVES` as a Mermaid ``stateDiagram-v2``, phases and events in their order here."""
    lines = ["stateDiagram-v2", f"    [*] --> {Phase.CHOOSING.name}"]
    for phase in Phase:
        moves = MOVES[phase]
        for event in (e for e in Event if e in moves):
            label = event.name.lower().replace("_", " ")
            lines.append(f"    {phase.name} --> {moves[event].name}: {label}")
    lines += [f"    {phase.name} --> [*]" for phase in Phase if phase in ENDED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(diagram(), end="")

"""crossbar.proxy.phases: the table of an exchange's moves, keyed by event, and the
diagram of it that docs/architecture.md shows. Pure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crossbar.proxy.phases import (
    ENDED,
    MOVES,
    Event,
    ImpossibleEvent,
    Phase,
    diagram,
    next_phase,
)

ARCHITECTURE = Path(__file__).parents[3] / "docs" / "architecture.md"


def test_the_table_has_every_phase_and_only_live_ones_move() -> None:
    assert set(MOVES) == set(Phase)
    assert all(not MOVES[phase] for phase in ENDED)
    assert all(MOVES[phase] for phase in Phase if phase not in ENDED)


def test_every_event_moves_some_phase() -> None:
    used = {event for moves in MOVES.values() for event in moves}
    assert used == set(Event)


def test_every_phase_reaches_an_end() -> None:
    for phase in Phase:
        seen, todo = {phase}, [phase]
        while todo:
            for after in MOVES[todo.pop()].values():
                if after not in seen:
                    seen.add(after)
                    todo.append(after)
        assert seen & ENDED, f"{phase.name} never ends"


def test_the_client_leaving_ends_every_live_phase() -> None:
    for phase in Phase:
        if phase not in ENDED:
            assert next_phase(phase, Event.CLIENT_LEFT) is Phase.CLIENT_LEFT


def test_an_event_moves_by_the_table() -> None:
    assert next_phase(Phase.CHOOSING, Event.CHOSEN) is Phase.WAITING
    assert next_phase(Phase.WAITING, Event.HOST_FAILED) is Phase.CHOOSING
    assert next_phase(Phase.STREAMING, Event.BODY_BROKEN) is Phase.CUT_OFF


def test_an_impossible_event_is_a_clear_error() -> None:
    with pytest.raises(ImpossibleEvent, match="BODY_ENDED cannot happen in phase QUEUED"):
        next_phase(Phase.QUEUED, Event.BODY_ENDED)


def test_a_late_event_after_the_end_changes_nothing() -> None:
    for phase in ENDED:
        for event in Event:
            assert next_phase(phase, event) is None


def test_the_diagram_shows_every_move_once_in_a_fixed_order() -> None:
    text = diagram()
    assert text.startswith("stateDiagram-v2\n    [*] --> CHOOSING\n")
    assert "    WAITING --> OPENING: head received\n" in text
    moves = sum(len(m) for m in MOVES.values())
    assert text.count(" --> ") == 1 + moves + len(ENDED)
    assert diagram() == text


def test_the_module_prints_the_diagram() -> None:
    run = [sys.executable, "-m", "crossbar.proxy.phases"]
    printed = subprocess.run(run, capture_output=True, text=True, check=True, timeout=60)
    assert printed.stdout == diagram()


def test_docs_architecture_shows_the_diagram_of_the_table() -> None:
    """Regenerate with ``python -m crossbar.proxy.phases`` between the two marker lines."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    start = lines.index("<!-- phases:start -->\n")
    end = lines.index("<!-- phases:end -->\n")
    block = "".join(lines[start + 1 : end])
    assert block == "```mermaid\n" + diagram() + "```\n"

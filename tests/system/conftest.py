"""Fixtures the system tests of the coding agents and clients share: each agent's CLI,
installed once into the cache outside the repository (:mod:`tests.support.agents`), and
crossbars that answer each of their own errors (:mod:`tests.support.refusing`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import install_claude, install_codex
from tests.support.refusing import refusing_crossbars


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    """Claude Code's CLI."""
    return install_claude()


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    """Codex's CLI."""
    return install_codex()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """By status, the base URL (without ``/v1``) and key where crossbar answers that error
    itself (:func:`tests.support.refusing.refusing_crossbars`)."""
    with refusing_crossbars(lambda: tmp_path_factory.mktemp("crossbar")) as found:
        yield found

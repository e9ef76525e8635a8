"""Fixtures the system tests of the coding agents share: each agent's CLI, installed once
into the cache outside the repository (:mod:`tests.support.agents`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agents import install_claude, install_codex


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    """Claude Code's CLI."""
    return install_claude()


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    """Codex's CLI."""
    return install_codex()

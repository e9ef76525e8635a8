"""Twisted's log, captured, so a test can assert on what crossbar said."""

from __future__ import annotations

from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from zope.interface import implementer


@implementer(ILogObserver)
class LogCapture:
    """Every log event while it is installed (from creation until :meth:`close`)."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []
        globalLogPublisher.addObserver(self)

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        globalLogPublisher.removeObserver(self)

    @property
    def lines(self) -> list[str]:
        """The events as formatted text, as they would appear in the log."""
        return [formatEvent(e) or "" for e in self.events]

    def matching(self, *parts: str) -> list[str]:
        """Lines that contain every one of ``parts``."""
        return [line for line in self.lines if all(p in line for p in parts)]

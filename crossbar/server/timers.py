"""The server side's clocks: the one rule for its timers (header deadlines, idle timers,
lingering), a deadline that moves without moving its timer, and the ``Date`` header's
value."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.web import http

_date = (0, b"")


def http_date() -> bytes:
    """The ``Date`` header's value, formatted once a second, not once a request."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, http.datetimeToString(now))
    return _date[1]


def stop(call: IDelayedCall | None) -> None:
    """Cancel a timer unless it has fired or been cancelled already: both are normal
    when a timer races the event it guards."""
    if call is not None and call.active():
        call.cancel()


class Deadline:
    """A deadline that moves often and rarely passes, on one timer that is not moved.

    A connection's idle timeout and its head's deadline are set again for every request
    and cleared once it has come: a timer made and cancelled each time (a ``DelayedCall``
    and a place in the reactor's heap) cost a request some 15,000 instructions apiece.
    Here setting a later time, or clearing it, is a store; the timer, when it fires, waits
    again for what is left, or lapses if nothing is due. ``on_due`` is called once the
    time set has passed with the deadline still set. :meth:`stop` cancels the timer too
    (a connection that closes is not kept for it).
    """

    __slots__ = ("_call", "_clock", "_fires", "_on_due", "due")

    def __init__(self, clock: IReactorTime, on_due: Callable[[], object]) -> None:
        self._clock = clock
        self._on_due = on_due
        self.due: float | None = None
        """When it passes, on the clock's time; ``None``: nothing due."""
        self._call: IDelayedCall | None = None
        self._fires = math.inf

    def set(self, seconds: float) -> None:
        """Due ``seconds`` from now (in place of any time set before)."""
        due = self._clock.seconds() + seconds
        self.due = due
        if self._call is None or self._fires > due:
            stop(self._call)
            self._arm(due, seconds)

    def clear(self) -> None:
        """Nothing due: the timer, if any, lapses when it fires."""
        self.due = None

    def stop(self) -> None:
        """Nothing due, and no timer."""
        self.due = None
        stop(self._call)
        self._call = None

    def _arm(self, due: float, seconds: float) -> None:
        self._fires = due
        self._call = self._clock.callLater(seconds, self._fire)

    def _fire(self) -> None:
        self._call = None
        due = self.due
        if due is None:
            return
        left = due - self._clock.seconds()
        if left > 0:
            self._arm(due, left)
            return
        self.due = None
        self._on_due()

"""The server side's clocks: the one rule for its timers (header deadlines, idle timers,
lingering), and the ``Date`` header's value."""

from __future__ import annotations

import time

from twisted.internet.interfaces import IDelayedCall
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

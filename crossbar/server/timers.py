"""The one rule for the server side's timers (header deadlines, idle timers, lingering)."""

from __future__ import annotations

from twisted.internet.interfaces import IDelayedCall


def stop(call: IDelayedCall | None) -> None:
    """Cancel a timer unless it has fired or been cancelled already: both are normal
    when a timer races the event it guards."""
    if call is not None and call.active():
        call.cancel()

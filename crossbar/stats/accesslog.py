"""The access log: one line per request as it ends, proxied or refused at the door, made
from its record (and the record itself in the event, for ``log_format: json``)."""

from __future__ import annotations

from collections.abc import Callable
from time import time

from twisted.logger import Logger, LogLevel

from crossbar.stats.accessline import access_line
from crossbar.stats.record import OTHER_MODEL, RequestRecord


def _nobody_lists(model: str) -> bool:
    return False


class _Line:
    """The line, made only if something formats the event: with ``log_format: json``
    the record is written instead, and the line's text would be made for nothing."""

    __slots__ = ("_record",)

    def __init__(self, record: RequestRecord) -> None:
        self._record = record

    def __str__(self) -> str:
        return access_line(self._record)

    def __format__(self, spec: str) -> str:
        return format(access_line(self._record), spec)


class AccessLog:
    """An observer of requests that logs each one's line (``crossbar.access``).

    ``knows`` says whether a host lists a model: the JSON line names a model no host
    lists as ``other``, so that a client cannot write what it likes, of any size, into
    the log. ``text=False`` (``log_format: json``): the line is made only if formatted.
    """

    def __init__(
        self,
        knows: Callable[[str], bool] = _nobody_lists,
        logger: Logger | None = None,
        text: bool = True,
    ) -> None:
        self._knows = knows
        self._line: Callable[[RequestRecord], object] = access_line if text else _Line
        self._log = logger or Logger(namespace="crossbar.access")

    def request_done(self, record: RequestRecord) -> None:
        """``logger.info("{request}", request=line, access=record, ...)``, made as
        ``Logger.emit`` makes an event, less its check that the level is a real one (it
        sorts every level for that): 1.6 µs a line, against 0.4 µs here."""
        model = record.model
        if model is not None and not self._knows(model):
            model = OTHER_MODEL
        logger = self._log
        logger.observer(
            {
                "request": self._line(record),
                "access": record,
                "access_model": model,
                "log_logger": logger,
                "log_level": LogLevel.info,
                "log_namespace": logger.namespace,
                "log_source": logger.source,
                "log_format": "{request}",
                "log_time": time(),
            }
        )

"""crossbar.polling.listreader in memory: a short model list is read in place, with no child
process. Long lists read by a child are in ``tests/system/test_listreader.py``.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.polling.listreader import INLINE_BYTES, ListReader
from crossbar.polling.modellist import read_models
from tests.support.modellists import ids


class NoProcesses:
    def spawnProcess(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("a short list must be read in place")


def test_a_short_list_is_read_in_place() -> None:
    body = ids(1000)
    assert len(body) <= INLINE_BYTES
    d = Deferred.fromCoroutine(ListReader(NoProcesses(), Clock()).read(body))  # type: ignore[arg-type]
    assert d.result == read_models(body)

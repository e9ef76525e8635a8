"""The usage ledger: an observer of every finished request that keeps its usage in the
SQLite store, a batch at a time, off the reactor's thread.

Requests are summed per minute in memory (:class:`~crossbar.usage.sums.MinuteSums`, a
dict update on the request's path); every :data:`FLUSH_SECONDS` the rows so far go to
the store's own thread in one transaction. A disk that is slow, locked by another
worker or stuck holds that thread only: requests go on, and their rows wait in memory
(at most ``most`` of them) to be written with the next batch. A stop writes the last
batch (waiting up to :data:`STOP_SECONDS`), so a restart loses at most that one; a
reload changes nothing here but ``retention``.

A file that cannot be opened (corrupt, unwritable, a folder) is one line in the log:
crossbar then serves without the store. One that fails later is one line when it
fails and one when it writes again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from crossbar.stats import RequestRecord
from crossbar.usage.queries import Rows, UsageQueries
from crossbar.usage.store import UsageStore
from crossbar.usage.sums import MinuteSums, Place, Refusal, Sums
from crossbar.usage.thread import Runner

FLUSH_SECONDS = 5.0
PRUNE_SECONDS = 3600.0
STUCK_SECONDS = 60.0
"""A write that has not ended in this long is said in the log (once)."""
STOP_SECONDS = 5.0
"""How long a stop waits for the last batch to be written."""
MOST_ROWS = 20_000
"""Rows (a minute of a route, host, model and key) held while the store cannot take
them: a few MB."""

log = Logger(namespace="crossbar.usage")


class UsageLedger(Service):
    """Keeps every finished request's usage in the store at ``path``, for ``retention``
    seconds; ``knows`` says whether a host lists a model (see :class:`MinuteSums`)."""

    def __init__(
        self,
        store: UsageStore,
        retention: float,
        clock: IReactorTime,
        thread: Runner,
        knows: Callable[[str], bool],
        *,
        queries: UsageQueries | None = None,
        every: float = FLUSH_SECONDS,
        most: int = MOST_ROWS,
    ) -> None:
        self.store, self.retention = store, retention
        self.queries = queries or UsageQueries(store, thread)
        """Where :meth:`query` reads: a connection and a thread apart from the writer's
        (by default the writer's own, as a ``":memory:"`` store must)."""
        self.off: str | None = None
        """Why the store is not used, in words; ``None`` while it is (or is opening)."""
        self.sums = MinuteSums(knows, most)
        self._clock, self._thread, self._every = clock, thread, every
        self._writing: Deferred[None] | None = None
        self._write_began = 0.0
        self._opening: Deferred[None] | None = None
        self._troubled: str | None = None
        """What the store failed at last (``write``, ``prune``), until it works again."""
        # The flush's tick does not wait for its write: a write that hangs is noticed.
        self._loops = (LoopingCall(lambda: self.flush() and None), LoopingCall(self.prune))
        for loop in self._loops:
            loop.clock = clock

    def request_done(self, record: RequestRecord) -> None:
        if self.off is None:
            self.sums.add(record, self._clock.seconds())

    # -- the service ------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        opening = self._thread.run(self.store.open)
        opening.addCallbacks(self._opened, self._not_opened)
        self._opening = opening

    def _opened(self, _: None) -> None:
        self._opening = None
        if not self.running:
            return
        flush, prune = self._loops
        flush.start(self._every, now=False)
        prune.start(PRUNE_SECONDS, now=True)

    def _not_opened(self, failure: Failure) -> None:
        self._opening = None
        self.off = f"cannot use {self.store.path}: {_reason(failure)}"
        self.sums.take(), self.sums.take_refused()
        log.error("usage store off, crossbar serves without it: {why}", why=self.off)

    def stopService(self) -> Deferred[None]:
        """Write the last batch, then close the file; given up after :data:`STOP_SECONDS`."""
        super().stopService()
        for loop in self._loops:
            if loop.running:
                loop.stop()

        async def last_batch() -> None:
            if self._opening is not None:
                await self._opening
            if self._writing is not None:
                await self._writing
            await self.flush()

        def end(in_time: bool) -> None:
            if ended.called:
                return
            ended.callback(None)
            if timer.active():
                timer.cancel()
            if not in_time:
                lost = sum(int(sums[0]) for sums in self.sums.rows.values())
                log.warn(
                    "usage store: the last batch was not written in {s:g} s; "
                    "the usage of {n} requests is lost",
                    s=STOP_SECONDS,
                    n=lost,
                )
            if self.off is None:
                self._thread.run(self.store.close).addErrback(lambda _: None)
            self._thread.stop()
            self.queries.stop()

        # No cancel of the write on time out: a thread cannot be stopped mid-call.
        ended: Deferred[None] = Deferred()
        timer = self._clock.callLater(STOP_SECONDS, end, False)
        Deferred.fromCoroutine(last_batch()).addBoth(lambda _: end(True))
        return ended

    # -- writing and pruning ----------------------------------------------------------------

    def flush(self) -> Deferred[None]:
        """Send the rows so far to the store, unless a batch is being written (one that
        has been for :data:`STUCK_SECONDS` is said, once)."""
        now = self._clock.seconds()
        if self._writing is not None:
            if now - self._write_began >= STUCK_SECONDS:
                self._trouble(None, "write")
            return self._writing
        if self.off is not None or not (self.sums or self.sums.refused):
            return succeed(None)
        batch, refused = self.sums.take(), self.sums.take_refused()
        writing = self._thread.run(self.store.add, batch, refused)
        writing.addCallbacks(self._worked, self._not_written, ("write",), {}, (batch, refused))
        self._writing, self._write_began = writing, now

        def done(_: None) -> None:
            self._writing = None

        return writing.addCallback(done)

    def _not_written(
        self, failure: Failure, batch: dict[Place, Sums], refused: dict[Refusal, int]
    ) -> None:
        self.sums.put_back(batch, refused)
        self._trouble(failure, "write")

    def prune(self) -> Deferred[None]:
        """Forget what is older than ``retention``."""
        before = self._clock.seconds() - self.retention
        pruning = self._thread.run(self.store.prune, before)
        return pruning.addCallbacks(self._worked, self._trouble, ("prune",), {}, ("prune",))

    def _trouble(self, failure: Failure | None, what: str) -> None:
        """Said once, until the store does ``what`` again."""
        if self._troubled is not None:
            return
        self._troubled = what
        why = f"no answer in {STUCK_SECONDS:g} s" if failure is None else _reason(failure)
        then = (
            f"; usage waits in memory (at most {self.sums.most} rows, a minute of a route, "
            "host, model and key each) to be written with a later batch"
            if what == "write"
            else "; tried again in an hour"
        )
        log.warn(
            "usage store: cannot {what} {path}: {why}{then}",
            what=what,
            path=self.store.path,
            why=why,
            then=then,
        )

    def _worked(self, _: object, what: str) -> None:
        if self._troubled != what:
            return
        self._troubled, dropped = None, self.sums.dropped
        self.sums.dropped = 0
        lost = f"; the usage of {dropped} requests was left out meanwhile" if dropped else ""
        log.info("usage store: {path} works again{lost}", path=self.store.path, lost=lost)

    # -- reading ----------------------------------------------------------------------------

    def query(
        self, since: float, until: float, by: Sequence[str], *, capped: bool = True
    ) -> Deferred[Rows]:
        """The store's sums over ``[since, until)`` by ``by`` (see :class:`UsageQueries`:
        a failure with ``QueriesBusy`` when too many ``capped`` ones run; cancelled, the
        query stops)."""
        return self.queries.query(since, until, by, capped=capped)

    def refused(self, since: float, until: float) -> Deferred[Rows]:
        """The requests not served over ``[since, until)``, by route, key and why."""
        return self.queries.refused(since, until)


def _reason(failure: Failure) -> str:
    """An error in one line of words: SQLite's own (``file is not a database``)."""
    text = " ".join(str(failure.value).split()) or type(failure.value).__name__
    return text[:300]

"""crossbar.polling.listreader with real child processes: a long model list is read by a child
while the reactor keeps turning; a child that fails, hangs or is cancelled ends in words,
and is killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock, LoopingCall, deferLater

from crossbar.polling.listreader import INLINE_BYTES, ListReader, ListUnread
from crossbar.polling.modellist import MAX_MODELS, read_models
from tests.support.modellists import ids


@pytest_twisted.ensureDeferred
async def test_a_long_list_is_read_by_a_child_while_the_reactor_turns() -> None:
    body = ids(520_000)
    turns = 0

    def turn() -> None:
        nonlocal turns
        turns += 1

    loop = LoopingCall(turn)
    loop.start(0.005, now=False)
    try:
        models = await ListReader(reactor, reactor).read(body)
    finally:
        loop.stop()
    print(f"the reactor turned {turns} times while a child read {len(body):,} bytes")
    assert models == read_models(body)
    assert (models.listed, models.cut, len(models.known)) == (520_000, True, MAX_MODELS)
    assert turns >= 3  # read in place, the reactor would not have turned at all


@pytest_twisted.ensureDeferred
async def test_a_long_answer_that_is_no_list_says_why_in_the_same_words() -> None:
    body = b'{"data": {"pad": "' + b"x" * (INLINE_BYTES + 1) + b'"}}'
    with pytest.raises(ValueError) as in_place:
        read_models(body)
    with pytest.raises(ValueError) as aside:
        await ListReader(reactor, reactor).read(body)
    assert str(aside.value) == str(in_place.value)


def command(code: str, pidfile: Path) -> tuple[str, ...]:
    """A child that writes its pid to ``pidfile``, reads its input, then runs ``code``."""
    start = f"import os,sys; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
    return (sys.executable, "-c", start + "sys.stdin.buffer.read(); " + code)


async def started(pidfile: Path) -> None:
    """Once the child has written its pid."""
    for _ in range(1000):
        if pidfile.exists() and pidfile.read_text():
            return
        await deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("the child never started")


async def gone(pidfile: Path) -> bool:
    """Whether the child that wrote ``pidfile`` has ended (reaped, or a zombie)."""
    for _ in range(400):
        if pidfile.exists() and pidfile.read_text():
            status = Path(f"/proc/{pidfile.read_text()}/status")
            if not status.exists() or "\nState:\tZ" in status.read_text():
                return True
        await deferLater(reactor, 0.01, lambda: None)
    return False


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("print('not json')", "the reader stopped without an answer"),
        ("sys.exit(3)", "the reader stopped without an answer"),
        ("sys.stdout.write('x' * (5 << 20))", "said over 4 MiB"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_child_without_a_good_answer_is_a_list_unread(
    tmp_path: Path, code: str, said: str
) -> None:
    pidfile = tmp_path / "pid"
    reader = ListReader(reactor, reactor, inline_bytes=0, command=command(code, pidfile))
    with pytest.raises(ListUnread) as unread:
        await reader.read(ids(10))
    assert str(unread.value) == said
    assert await gone(pidfile)


@pytest_twisted.ensureDeferred
async def test_a_child_that_takes_too_long_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    clock = Clock()
    sleeper = command("import time; time.sleep(60)", pidfile)
    reader = ListReader(reactor, clock, inline_bytes=0, timeout=30, command=sleeper)
    d = Deferred.fromCoroutine(reader.read(ids(10)))
    await started(pidfile)  # now let its time run out
    clock.advance(30)
    with pytest.raises(ListUnread, match=r"^took over 30 s$"):
        await d
    assert await gone(pidfile)


@pytest_twisted.ensureDeferred
async def test_a_read_cancelled_kills_its_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    sleeper = command("import time; time.sleep(60)", pidfile)
    reader = ListReader(reactor, Clock(), inline_bytes=0, command=sleeper)
    d = Deferred.fromCoroutine(reader.read(ids(10)))
    await started(pidfile)
    d.cancel()
    with pytest.raises(CancelledError):
        await d
    assert await gone(pidfile)

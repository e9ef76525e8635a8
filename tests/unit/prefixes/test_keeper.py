"""crossbar.prefixes.keeper: a popular prefix's slot saved once per host, restored into a
free slot before a new conversation's first turn; a host without saves refuses and is left
alone; a failure only backs off. Through StubTreq against a fake host answering as
llama-server does (no sockets)."""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from crossbar.prefixes import PrefixCounts, PrefixKeeper, PrefixSaves
from crossbar.prefixes.keeper import SAVE_TIMEOUT, TIMEOUT
from crossbar.routing import Conversation

NEW = Conversation(b"k1", 0, b"prefix")
LATER = Conversation(b"k1", 3, b"prefix")


class FakeHost(Resource):
    """``/props``, ``/slots`` and the slot actions, as a llama-server answers them."""

    isLeaf = True

    def __init__(self, save_path: bool = True, build: str = "b1") -> None:
        super().__init__()
        self.save_path, self.build, self.started = save_path, build, "marker-1"
        self.gets = 0
        self.slots: list[dict[str, Any]] = [{"id": 0}, {"id": 1}]
        self.files: dict[str, int] = {}
        self.actions: list[tuple[str, int, dict[str, Any]]] = []
        self.held: list[tuple[Request, int, str]] = []
        """Saves of a busy slot, answered when its turn ends (:meth:`turn_ended`)."""

    def render_GET(self, request: Request) -> bytes:
        self.gets += 1
        if request.path == b"/props":
            return json.dumps({"build_info": self.build, "media_marker": self.started}).encode()
        return json.dumps(self.slots).encode()

    def render_POST(self, request: Request) -> bytes | int:
        assert request.content is not None
        body = json.loads(request.content.read())
        action = request.args[b"action"][0].decode()
        slot = int(request.path.rsplit(b"/", 1)[1])
        self.actions.append((action, slot, body))
        if not self.save_path:
            request.setResponseCode(501)
            return b'{"error":{"code":501,"message":"This server does not support slots action."}}'
        if action == "save" and self.slots[slot].get("is_processing"):
            self.held.append((request, slot, body["filename"]))  # llama-server defers it
            return NOT_DONE_YET
        if action == "save":
            return self._save(slot, body["filename"])
        if body["filename"] not in self.files:
            request.setResponseCode(400)
            return b'{"error":{"code":400,"message":"invalid slot save file"}}'
        tokens = self.files[body["filename"]]
        self.slots[slot] |= {"id_task": 99, "n_prompt_tokens": tokens}
        return json.dumps({"n_restored": tokens}).encode()

    def _save(self, slot: int, name: str) -> bytes:
        self.files[name] = self.slots[slot]["n_prompt_tokens"]
        return json.dumps({"n_saved": self.files[name]}).encode()

    def turn_ended(self, slot: int) -> None:
        """The turn running in ``slot`` ended: the saves held for it are answered."""
        self.slots[slot]["is_processing"] = False
        for request, at, name in [h for h in self.held if h[1] == slot]:
            self.held.remove((request, at, name))
            request.write(self._save(at, name))
            request.finish()


def keeper(host: FakeHost) -> tuple[PrefixKeeper, Clock]:
    clock = Clock()
    saves = PrefixSaves(lambda name: 8)
    return PrefixKeeper(StubTreq(host), {"a": "http://a"}, clock, saves, PrefixCounts()), clock


def ran_first_turn(keeper: PrefixKeeper, host: FakeHost, slot: int) -> None:
    """A new conversation's first turn went to ``host`` and ran in ``slot``."""
    keeper.before("lab", "m", "a", NEW)
    host.slots[slot] |= {"id_task": 10 + len(host.actions), "n_prompt_tokens": 900}
    keeper.finished("lab", "m", "a", NEW, ok=True)


def test_a_popular_prefix_is_saved_once_and_restored_into_a_free_slot() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    ran_first_turn(keep, host, 0)
    assert host.actions == []  # seen once: not popular yet
    ran_first_turn(keep, host, 0)
    assert host.actions == [("save", 0, {"filename": "crossbar-prefix-0.bin", "model": "m"})]
    ran_first_turn(keep, host, 0)  # restored before it, saved no more
    assert host.actions[1:] == [("restore", 1, {"filename": "crossbar-prefix-0.bin", "model": "m"})]
    assert host.slots[1]["n_prompt_tokens"] == 900


def test_nothing_is_restored_over_a_slot_that_holds_a_prompt() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    host.slots[1] |= {"id_task": 50, "n_prompt_tokens": 300}  # another conversation's cache
    assert keep.before("lab", "m", "a", NEW) is not None
    assert [a[0] for a in host.actions] == ["save"]


def test_later_turns_add_nothing_on_the_way() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    assert keep.before("lab", "m", "a", LATER) is None
    assert keep.before("lab", "m", "a", Conversation(b"k", 0, None)) is None
    assert keep.finished("lab", "m", "a", NEW, ok=False) is None


def test_a_host_without_a_save_path_is_asked_once() -> None:
    host = FakeHost(save_path=False)
    keep, _ = keeper(host)
    for _ in range(4):
        ran_first_turn(keep, host, 0)
    assert [a[0] for a in host.actions] == ["save"]
    assert keep.saves.allows("a") is False
    assert keep.before("lab", "m", "a", NEW) is None


def test_a_prefix_popular_only_after_a_hosts_first_turn_is_saved_after_a_later_turn() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    ran_first_turn(keep, host, 0)  # the first conversation anywhere: not popular yet
    assert keep.finished("lab", "m", "a", LATER, ok=True) is None
    keep.before("lab", "m", "b", NEW)  # a second one begins, on another host
    host.slots[0] |= {"id_task": 20, "n_prompt_tokens": 1200}  # the first one's next turn
    keep.finished("lab", "m", "a", LATER, ok=True)
    assert host.actions == [("save", 0, {"filename": "crossbar-prefix-0.bin", "model": "m"})]
    keep.before("lab", "m", "a", NEW)  # the host's next new conversation gains from it
    assert host.actions[1:] == [("restore", 1, {"filename": "crossbar-prefix-0.bin", "model": "m"})]


def saving_a_busy_slot(keep: PrefixKeeper, host: FakeHost) -> Deferred[None]:
    """The first conversation on ``host`` ran its first turn there, a second one began on
    another host, and the first one's next turn already runs in slot 0 as the turn before
    it is done: the save that follows."""
    ran_first_turn(keep, host, 0)
    keep.before("lab", "m", "b", NEW)
    host.slots[0] |= {"id_task": 20, "n_prompt_tokens": 1200, "is_processing": True}
    saving = keep.finished("lab", "m", "a", LATER, ok=True)
    assert saving is not None
    return saving


def test_a_slot_already_busy_with_the_next_turn_is_saved_when_that_turn_ends() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    saving = saving_a_busy_slot(keep, host)
    assert not saving.called
    assert [(a[0], a[1]) for a in host.actions] == [("save", 0)]  # asked at once, held
    assert keep.finished("lab", "m", "a", LATER, ok=True) is None  # one save at a time
    assert keep.before("lab", "m", "a", NEW) is None  # nothing saved yet to restore
    host.turn_ended(0)
    keep._client.flush()  # type: ignore[attr-defined]
    assert saving.called and keep.saves.holds("a", "m", b"prefix")
    assert keep.before("lab", "m", "a", NEW) is not None


def test_a_save_held_past_its_bound_is_given_up_and_backs_off() -> None:
    host = FakeHost()
    keep, clock = keeper(host)
    saving = saving_a_busy_slot(keep, host)
    clock.advance(SAVE_TIMEOUT)  # the turn never ended
    assert saving.called and not keep.saves.holds("a", "m", b"prefix")
    assert not keep.saves.may_ask("a", clock.seconds())
    clock.advance(31)
    host.slots[0]["is_processing"] = False
    keep.finished("lab", "m", "a", LATER, ok=True)  # asked again once the back-off ends
    assert keep.saves.holds("a", "m", b"prefix")


def test_later_turns_of_a_saved_prefix_ask_the_host_nothing() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    asked = (host.gets, len(host.actions))
    assert keep.finished("lab", "m", "a", LATER, ok=True) is None
    assert (host.gets, len(host.actions)) == asked


def test_a_new_build_saves_again_rather_than_restoring() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    host.build, host.slots = "b2", [{"id": 0}, {"id": 1}]
    ran_first_turn(keep, host, 0)
    assert [a[0] for a in host.actions] == ["save", "save"]


def test_a_failed_restore_costs_the_turn_nothing_and_backs_off() -> None:
    host = FakeHost()
    keep, clock = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    host.files.clear()  # the file went away (the host's folder was emptied)
    done = keep.before("lab", "m", "a", NEW)
    assert done is not None and self_result(done) is None
    assert keep.before("lab", "m", "a", NEW) is None  # backing off
    clock.advance(31)
    assert keep.before("lab", "m", "a", NEW) is not None


def test_a_reloaded_model_saves_again_rather_than_restoring() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    host.started, host.slots = "marker-2", [{"id": 0}, {"id": 1}]  # a new model server
    ran_first_turn(keep, host, 0)
    assert [a[0] for a in host.actions] == ["save", "save"]


def test_a_new_conversation_with_nothing_saved_is_sent_at_once() -> None:
    host = FakeHost()
    keep, _ = keeper(host)
    assert keep.before("lab", "m", "a", NEW) is None
    assert host.gets == 0


class SilentHost(FakeHost):
    def render_GET(self, request: Request) -> Any:
        if self.gets:
            return NOT_DONE_YET  # asked again: never answers
        return super().render_GET(request)


def test_a_host_that_does_not_answer_a_restore_holds_the_turn_two_seconds_at_most() -> None:
    host = FakeHost()
    keep, clock = keeper(host)
    for _ in range(2):
        ran_first_turn(keep, host, 0)
    silent = SilentHost()
    keep._client = StubTreq(silent)  # the same host, gone quiet
    done = keep.before("lab", "m", "a", NEW)
    assert done is not None and not done.called
    clock.advance(TIMEOUT)
    assert done.called and self_result(done) is None
    assert not keep.saves.may_ask("a", clock.seconds())


def self_result(d: Any) -> Any:
    results: list[Any] = []
    d.addBoth(results.append)
    return results[0]

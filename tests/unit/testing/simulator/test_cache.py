"""The simulated llama-server keeps a prompt cache as the real one does: what a router does
to a conversation shows in ``timings.cache_n`` / ``prompt_n``, and in how long it takes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.testing import SimulatedHost
from crossbar.testing.simulator.cache import PromptCache, tokenize

CHAT = "/v1/chat/completions"
SYSTEM = "You are a careful coding agent. Follow the repository's rules. " * 20


Messages = list[dict[str, Any]]


def first_turn(agent: int, system: str = SYSTEM) -> Messages:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Agent {agent}: fix the failing test in module {agent}."},
    ]


def next_turn(messages: list[dict[str, Any]], answer: str, n: int) -> list[dict[str, Any]]:
    """The conversation so far, the answer to it, and one more user message."""
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": f"Now run the tests again ({n})."},
    ]


class Client:
    """Completions straight into a simulated host's resource, no sockets."""

    def __init__(self, sim: SimulatedHost) -> None:
        self.stub = StubTreq(sim.resource)

    def post(self, messages: list[dict[str, Any]], **extra: Any) -> Deferred[Any]:
        body = {"model": "tiny-a", "messages": messages, "seed": 1, **extra}
        return Deferred.fromCoroutine(self._post(body))

    async def _post(self, body: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(answer, timings, usage) of one chat completion, streamed or not."""
        response = await self.stub.post("http://sim" + CHAT, json=body)
        assert response.code == 200
        data = await self.stub.content(response)
        if not body.get("stream"):
            whole = json.loads(data)
            return whole["choices"][0]["message"]["content"], whole["timings"], whole["usage"]
        events = [json.loads(e[6:]) for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        return text, events[-1]["timings"], events[-1]["usage"]

    async def chat(self, messages: list[dict[str, Any]], **extra: Any) -> Any:
        return await self.post(messages, **extra)


def prompt_size(sim: SimulatedHost) -> int:
    last = sim.prefills[-1]
    return last.cache_n + last.prompt_n


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest_twisted.ensureDeferred
async def test_a_second_turn_reuses_the_first_prompt_and_its_answer(stream: bool) -> None:
    sim = SimulatedHost()
    client = Client(sim)
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    turn1 = first_turn(1)
    answer, timings, usage = await client.chat(turn1, **extra)
    first = usage["prompt_tokens"]
    assert (timings["cache_n"], timings["prompt_n"]) == (0, first) and first > 200
    turn2 = next_turn(turn1, answer, 2)
    _, timings, usage = await client.chat(turn2, **extra)
    # Everything the slot kept: the first prompt and the answer to it (four letters a token).
    assert timings["cache_n"] == first + len(tokenize(answer))
    assert usage["prompt_tokens_details"] == {"cached_tokens": timings["cache_n"]}
    assert timings["cache_n"] + timings["prompt_n"] == usage["prompt_tokens"]
    assert 5 < timings["prompt_n"] < 30  # the new messages only
    # The same prompt again: all of it is cached but its last token, evaluated to answer.
    _, timings, _ = await client.chat(turn2, **extra)
    assert (timings["cache_n"], timings["prompt_n"]) == (usage["prompt_tokens"] - 1, 1)


@pytest_twisted.ensureDeferred
async def test_text_completions_reuse_their_prefix_too() -> None:
    sim = SimulatedHost()
    stub = StubTreq(sim.resource)
    prompt = "def parse(config):\n    " * 40
    first = await stub.post("http://sim/v1/completions", json={"model": "tiny-a", "prompt": prompt})
    text = (await first.json())["choices"][0]["text"]
    body = {"model": "tiny-a", "prompt": prompt + text + "\n\nexplain"}
    later = await (await stub.post("http://sim/v1/completions", json=body)).json()
    assert later["timings"]["cache_n"] == len(tokenize(prompt + text)) + 1  # and the start token
    assert later["timings"]["prompt_n"] == len(tokenize("\n\nexplain"))


async def one_slot_a_b_a(sim: SimulatedHost, a1: Messages, b1: Messages) -> tuple[int, int]:
    """Conversation a, then b, then a's second turn: (a's tokens in the slot after its first
    turn, what its second turn found cached)."""
    client = Client(sim)
    answer, _, usage = await client.chat(a1)
    kept = usage["prompt_tokens"] + len(tokenize(answer))
    await client.chat(b1)
    _, timings, _ = await client.chat(next_turn(a1, answer, 2))
    return kept, timings["cache_n"]


@pytest_twisted.ensureDeferred
async def test_one_slot_loses_a_conversation_to_another_unless_host_memory_keeps_it() -> None:
    """Agents with prompts of their own: b takes the least recently used slot, a's; only the
    host-memory cache (``--cache-ram``) brings a back."""
    a1 = first_turn(1, "Agent one's own rules. " * 30)
    b1 = first_turn(2, "Agent two's own rules. " * 30)
    sim = SimulatedHost(slots=1, cache_ram=0)
    _, cache_n = await one_slot_a_b_a(sim, a1, b1)
    assert cache_n < 20 and not sim.prefills[-1].restored  # the template's start
    sim = SimulatedHost(slots=1, cache_ram=100_000)
    kept, cache_n = await one_slot_a_b_a(sim, a1, b1)
    assert cache_n == kept and sim.prefills[-1].restored


@pytest_twisted.ensureDeferred
async def test_a_shared_system_prompt_is_reused_but_the_rest_is_lost() -> None:
    """Agents sharing a long system prompt: b takes a's slot by similarity and, as that keeps
    most of what the slot holds, llama-server does not save it to host memory; a's second
    turn finds the system prompt only, with or without host memory."""
    shared = len(tokenize(SYSTEM))
    for cache_ram in (0, 100_000):
        sim = SimulatedHost(slots=1, cache_ram=cache_ram)
        kept, cache_n = await one_slot_a_b_a(sim, first_turn(1), first_turn(2))
        assert shared < cache_n < shared + 20 < kept, cache_ram
        assert not sim.prefills[-1].restored


@pytest_twisted.ensureDeferred
async def test_host_memory_keeps_what_fits_its_budget_dropping_the_oldest() -> None:
    conversations = [first_turn(n, f"Rules of agent {n}. " * 60) for n in range(3)]
    sim = SimulatedHost(slots=1, cache_ram=1000)  # one conversation's worth, not two
    client = Client(sim)
    answers = [(await client.chat(messages))[0] for messages in conversations]
    state = sim.cache()
    assert state is not None and len(state.saved) == 1 and state.slots[0] > 0
    assert state.saved[0] <= 1000 < state.saved[0] + state.slots[0]
    # The second is in host memory, the first was dropped from it, the third is in the slot.
    for n, expect_restored in ((1, True), (0, False)):
        await client.chat(next_turn(conversations[n], answers[n], 2))
        assert sim.prefills[-1].restored is expect_restored, n


async def five_agents_two_turns(sim: SimulatedHost) -> list[tuple[int, int]]:
    """Five agents with prompts of their own, each turn of all in order: (cache_n, prompt_n)."""
    client = Client(sim)
    agents = [first_turn(n, f"Rules of agent {n}. " * 40) for n in range(5)]
    answers = [(await client.chat(messages))[0] for messages in agents]
    for n, messages in enumerate(agents):
        await client.chat(next_turn(messages, answers[n], 2))
    return [(p.cache_n, p.prompt_n) for p in sim.prefills]


@pytest_twisted.ensureDeferred
async def test_five_conversations_thrash_four_slots_but_not_five_and_it_is_repeatable() -> None:
    thrashed = await five_agents_two_turns(SimulatedHost(slots=4, cache_ram=0))
    # Each second turn finds its slot taken by a newer conversation: all of it again.
    # (what they share: the template's start and "Rules of agent")
    assert all(cache_n < 20 for cache_n, _ in thrashed[5:])
    assert all(prompt_n > 200 for _, prompt_n in thrashed[5:])
    for slots, cache_ram in ((5, 0), (4, 100_000)):
        kept = await five_agents_two_turns(SimulatedHost(slots=slots, cache_ram=cache_ram))
        assert all(cache_n < 20 for cache_n, _ in kept[:5])
        assert all(cache_n > 200 and prompt_n < 30 for cache_n, prompt_n in kept[5:])
    # The same requests in the same order find the same cache.
    assert await five_agents_two_turns(SimulatedHost(slots=4, cache_ram=0)) == thrashed


def settle(clock: Clock, stub: StubTreq) -> None:
    """Let every timer due now fire and every answer they released arrive."""
    clock.advance(0)
    stub.flush()


def run_until(clock: Clock, stub: StubTreq, done: list[Any], limit: float = 60.0) -> float:
    """Advance ``clock`` one timer at a time until ``done`` has something; the time it took."""
    started = clock.seconds()
    settle(clock, stub)
    while not done and clock.seconds() - started < limit:
        due = min((c.getTime() for c in clock.getDelayedCalls()), default=clock.seconds() + 1)
        clock.advance(due - clock.seconds())
        stub.flush()
    return clock.seconds() - started


@pytest_twisted.ensureDeferred
async def test_prefill_takes_time_for_every_token_not_in_the_cache() -> None:
    clock = Clock()
    sim = SimulatedHost(reactor=clock, prefill_time=0.001)  # 1 ms a token
    client = Client(sim)
    seconds = []
    messages = first_turn(1)
    for _ in range(2):
        done: list[Any] = []
        client.post(messages).addCallback(done.append)
        seconds.append(run_until(clock, client.stub, done))
        ((_, timings, _),) = done
        assert timings["prompt_ms"] == pytest.approx(timings["prompt_n"] * 1.0)
        assert seconds[-1] == pytest.approx(timings["prompt_n"] / 1000)
    cold, cached = seconds
    assert cold == pytest.approx(prompt_size(sim) / 1000) and cold > 0.2
    assert cached == pytest.approx(0.001)  # one token


@pytest_twisted.ensureDeferred
async def test_a_request_waits_while_every_slot_is_busy() -> None:
    clock = Clock()
    sim = SimulatedHost(reactor=clock, slots=1, chunks=10, chunk_interval=0.1)
    client = Client(sim)
    first: list[Any] = []
    second: list[Any] = []
    client.post(first_turn(1)).addCallback(first.append)
    client.post(first_turn(2)).addCallback(second.append)
    settle(clock, client.stub)
    state = sim.cache()
    assert state is not None and state.busy == (True,) and len(sim.prefills) == 1
    assert run_until(clock, client.stub, first) == pytest.approx(1.0)
    assert not second and len(sim.prefills) == 2  # it has the slot now
    assert run_until(clock, client.stub, second) == pytest.approx(1.0)
    later = sim.cache()
    assert later is not None and later.busy == (False,) and later.slots[0] > 200


def test_the_cache_follows_llama_servers_slot_choice() -> None:
    """Unit: a match above the similarity wins over recency; without one, the least recently
    used idle slot, the last of equals (all slots start unused)."""
    cache = PromptCache("m", slots=3, cache_ram=0)
    a = ("<s>", *"aaaaaaaaaa")
    b = ("<s>", *"bbbbbbbbbb")
    first = cache.start(a)
    assert first is not None and first.slot == 2  # the last of the unused
    cache.finish(first.slot, a)
    second = cache.start(b)
    assert second is not None and second.slot == 1
    cache.finish(second.slot, b)
    again = cache.start((*a, "x"))
    assert again is not None and (again.slot, again.cache_n, again.prompt_n) == (2, 11, 1)
    busy = cache.start(a)  # slot 2 is busy: the best idle one is the unused slot 0
    assert busy is not None and (busy.slot, busy.cache_n) == (0, 0)
    assert cache.start(b) is not None
    assert cache.start(a) is None  # all three busy


@pytest_twisted.ensureDeferred
async def test_a_model_that_restarts_starts_with_an_empty_cache() -> None:
    sim = SimulatedHost({"tiny-a": "loaded"})
    client = Client(sim)
    turn1 = first_turn(1)
    answer, _, _ = await client.chat(turn1)
    unloaded = await client.stub.post("http://sim/models/unload", json={"model": "tiny-a"})
    assert unloaded.code == 200 and sim.status("tiny-a") == "unloaded"
    _, timings, _ = await client.chat(next_turn(turn1, answer, 2))  # loads it again
    assert timings["cache_n"] == 0

"""Prompt-cache reuse on real llama-servers, one route policy after another:

    .venv/bin/python benchmarks/affinity.py [--agents 12] [--turns 8] [--out FILE]

Starts HOSTS real ``llama-server`` processes (the integration build, from
``scripts/llama-server.sh``; single-model mode, a tiny model from ``scripts/tiny_models.py``
whose context is raised to 32k, ``-c 32768 -np 4``: 4 slots of 8k each) behind crossbar
(``twistd -n crossbar``, hosts declared with ``slots:``), and replays AGENTS coding agents of
TURNS turns each, all at once: one shared system prompt of about 1,500 tokens, a distinct
first user message per agent, and every later turn resending the conversation so far with the
previous answer and a new user message. Once per policy, every host and crossbar started
fresh; then ``cache_affinity`` once more through two crossbar replicas of the same config,
each agent's turns alternating between them.

Per run: tokens prefilled (sum of ``timings.prompt_n``), tokens reused (sum of
``timings.cache_n``), the ideal, the ratio to it, time to the first token and to the end of
the (streamed) answer p50/p95, conversations per host (where each one's first turn went)
and the share of turns sent to the host of the turn before.

The ideal is what a host that kept every conversation would prefill: the shared prefix once per
host used (the longest common prefix, counted with ``/tokenize``, of two agents' first prompts
as ``/apply-template`` renders them), plus each conversation's last prompt (``prompt_n +
cache_n``) minus that prefix. That is its first prompt beyond the prefix plus every later
turn's new tokens, the previous answer included: a random model's answer does not re-tokenize
to the tokens it generated. The floor is the same with the shared prefix counted once per
conversation: when all conversations start at once, each first prompt is prefilled whole in a
slot of its own, whatever the router does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.affinity_fleet import (  # noqa: E402
    MODEL,
    ROUTE,
    SAVES,
    STORE,
    WORKERS,
    fleet,
    llama_server_binary,
    post,
    version,
)
from tests.support import Daemon  # noqa: E402

POLICIES = ("priority", "round_robin", "least_busy", "cache_affinity")
REPLICAS = "cache_affinity, 2 replicas"
SHARED = REPLICAS + STORE
WORDS = ("the", "a", "and", "of", "to", "is", "in", "it", "hello", "world", "cross", "bar",
         "model", "tiny", "ing", "ed", "er", "es", "th", "he", "an")  # fmt: skip


def stream(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a streamed chat completion; the answer's text, its timings, the host that served
    it, and the seconds to its first token and to its end."""
    data = json.dumps({**body, "stream": True}).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    began = time.perf_counter()
    first, parts, timings = None, [], {}
    with urllib.request.urlopen(request, timeout=600) as response:
        host = response.headers.get("X-Crossbar-Host", "")
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            timings = event.get("timings", timings)
            for choice in event.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    parts.append(choice["delta"]["content"])
    done = time.perf_counter()
    return {
        "text": "".join(parts),
        "timings": timings,
        "host": host,
        "first_token": (first or done) - began,
        "seconds": done - began,
    }


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Conversation:
    """One agent's messages: the shared system prompt, then its own turns."""

    def __init__(self, agent: int, system: str, user_words: int) -> None:
        self.agent = agent
        self.rng = random.Random(f"agent-{agent}")
        self.user_words = user_words
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}]

    def ask(self, turn: int) -> list[dict[str, str]]:
        words = text(self.rng, self.user_words)
        self.messages.append(
            {"role": "user", "content": f"Agent {self.agent}, turn {turn}: {words}"}
        )
        return self.messages

    def answered(self, answer: str) -> None:
        self.messages.append({"role": "assistant", "content": answer})


# ---------------------------------------------------------------------------- one run


def shared_prefix(host: Daemon, system: str) -> int:
    """Tokens two agents' first prompts have in common, as the host tokenizes them."""
    prompts = []
    for agent in (0, 1):
        messages = Conversation(agent, system, 8).ask(1)
        rendered = post(f"{host.url}/apply-template", {"messages": messages})[0]["prompt"]
        body = {"content": rendered, "add_special": True}
        prompts.append(post(f"{host.url}/tokenize", body)[0]["tokens"])
    same = 0
    for a, b in zip(*prompts, strict=False):
        if a != b:
            break
        same += 1
    return same


def run_agents(args: argparse.Namespace, proxies: Sequence[Daemon], system: str) -> list[dict]:
    """Every agent's turns, all agents at once; one record per turn."""
    start = threading.Barrier(args.agents)
    began = time.monotonic()

    def agent(index: int) -> list[dict[str, Any]]:
        conversation = Conversation(index, system, args.user_words)
        records = []
        start.wait()
        time.sleep(max(0.0, began + index * args.stagger - time.monotonic()))
        for turn in range(1, args.turns + 1):
            replica = (index + turn) % len(proxies)
            body = {
                "model": MODEL,
                "messages": conversation.ask(turn),
                "max_tokens": args.answer_tokens,
                "temperature": 0.8,
                "seed": index * 1000 + turn,
            }
            answer = stream(f"{proxies[replica].url}/{ROUTE}/v1/chat/completions", body)
            conversation.answered(answer["text"])
            records.append(
                {
                    "agent": index,
                    "turn": turn,
                    "replica": replica,
                    "host": answer["host"],
                    "prompt_n": answer["timings"]["prompt_n"],
                    "cache_n": answer["timings"]["cache_n"],
                    "first_token": round(answer["first_token"], 4),
                    "seconds": round(answer["seconds"], 4),
                }
            )
        return records

    with ThreadPoolExecutor(max_workers=args.agents) as pool:
        results = list(pool.map(agent, range(args.agents)))
    return [record for records in results for record in records]


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summarize(
    name: str, turns: list[dict[str, Any]], shared: int, host_names: Sequence[str], wall: float
) -> dict[str, Any]:
    last: dict[int, dict[str, Any]] = {}
    first_host: dict[int, str] = {}
    previous: dict[int, str] = {}
    stayed = later = 0
    hosts_of: dict[Any, set[str]] = {}
    for t in sorted(turns, key=lambda t: (t["agent"], t["turn"])):
        agent = t["agent"]
        hosts_of.setdefault(agent, set()).add(t["host"])
        last[agent] = t
        first_host.setdefault(agent, t["host"])
        if agent in previous:
            later += 1
            stayed += previous[agent] == t["host"]
        previous[agent] = t["host"]
    used = {t["host"] for t in turns}
    ideal = shared * len(used) + sum(t["prompt_n"] + t["cache_n"] - shared for t in last.values())
    prefilled = sum(t["prompt_n"] for t in turns)
    # When every conversation starts at once, each one's first prompt is prefilled whole in a
    # slot of its own (no slot holds the shared prefix yet): the least any policy can do then.
    floor = sum(t["prompt_n"] + t["cache_n"] for t in last.values())
    opening = [t["first_token"] for t in turns if t["turn"] == 1]
    homes = Counter(first_host.values())
    seconds = [t["seconds"] for t in turns]
    first = [t["first_token"] for t in turns]
    fair = len(first_host) / len(host_names)
    return {
        "run": name,
        "prefilled": prefilled,
        "reused": sum(t["cache_n"] for t in turns),
        "ideal": ideal,
        "floor": floor,
        "vs_ideal": round(prefilled / ideal, 3),
        "first_token_p50_ms": round(statistics.median(first) * 1000, 1),
        "first_token_p95_ms": round(percentile(first, 0.95) * 1000, 1),
        "new_conversation_first_token_p50_ms": round(statistics.median(opening) * 1000, 1),
        "later_turns_prefilled": sum(t["prompt_n"] for t in turns if t["turn"] > 1),
        "answer_p50_ms": round(statistics.median(seconds) * 1000, 1),
        "answer_p95_ms": round(percentile(seconds, 0.95) * 1000, 1),
        "conversations_per_host": {h: homes.get(h, 0) for h in host_names},
        "max_vs_fair_share": round(max(homes.values()) / fair, 3),
        "turns_on_previous_host": round(stayed / later, 3) if later else None,
        "conversations_split": sum(len(h) > 1 for h in hosts_of.values()),
        "shared_prefix_tokens": shared,
        "wall_seconds": round(wall, 1),
    }


# ---------------------------------------------------------------------------- report


def table(runs: Sequence[dict[str, Any]]) -> str:
    rows = [
        "| run | prefilled | reused | ideal | x ideal | x floor | first token p50 / p95 ms "
        "| answer p50 / p95 ms | conversations per host | turns on previous host |",
        "|---|--:|--:|--:|--:|--:|--:|--:|---|--:|",
    ]
    for r in runs:
        per_host = " / ".join(str(n) for n in r["conversations_per_host"].values())
        rows.append(
            f"| {r['run']} | {r['prefilled']:,} | {r['reused']:,} | {r['ideal']:,} "
            f"| {r['vs_ideal']:.2f} | {r['prefilled'] / r['floor']:.2f} "
            f"| {r['first_token_p50_ms']:.0f} / {r['first_token_p95_ms']:.0f} "
            f"| {r['answer_p50_ms']:.0f} / {r['answer_p95_ms']:.0f} | {per_host} "
            f"| {r['turns_on_previous_host']:.0%} |"
        )
    return "\n".join(rows)


def targets(runs: Sequence[dict[str, Any]]) -> list[tuple[str, bool]]:
    """The issue's targets that these runs can be judged on, and whether each is met."""
    by = {r["run"]: r for r in runs}
    ca, rr, two = by.get("cache_affinity"), by.get("round_robin"), by.get(REPLICAS)
    found: list[tuple[str, bool]] = []
    if ca:
        found.append(
            (
                f"cache_affinity at most 1.25x its ideal ({ca['vs_ideal']:.2f}x)",
                ca["vs_ideal"] <= 1.25,
            )
        )
        share = ca["max_vs_fair_share"]
        found.append(
            (f"no host above 1.5x its fair share of conversations ({share:.2f}x)", share <= 1.5)
        )
    if ca and rr:
        fewer = rr["prefilled"] / ca["prefilled"]
        found.append(
            (f"at least 3x fewer tokens prefilled than round_robin ({fewer:.1f}x)", fewer >= 3)
        )
        for what in ("first_token", "answer"):
            mine, theirs = ca[f"{what}_p50_ms"], rr[f"{what}_p50_ms"]
            label = f"{what.replace('_', ' ')} p50 below round_robin's"
            found.append((f"{label} ({mine:.0f} vs {theirs:.0f} ms)", mine < theirs))
    saved = by.get("cache_affinity" + SAVES)
    if saved:
        ratio = saved["vs_ideal"]
        found.append((f"with saved prefixes at most 1.15x the ideal ({ratio:.2f}x)", ratio <= 1.15))
    if ca and saved:
        mine, theirs = (r["new_conversation_first_token_p50_ms"] for r in (saved, ca))
        label = "a new conversation's first token p50 faster with saved prefixes"
        found.append((f"{label} ({mine:.0f} vs {theirs:.0f} ms)", mine < theirs))
        mine, theirs = saved["later_turns_prefilled"], ca["later_turns_prefilled"]
        label = "later turns prefill no more with saved prefixes"
        found.append((f"{label} ({mine:,} vs {theirs:,} tokens)", mine <= theirs))
    if ca and two:
        off = two["prefilled"] / ca["prefilled"] - 1
        found.append((f"two replicas within 10% of one ({off:+.1%})", abs(off) <= 0.10))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--agents", type=int, default=12, help="conversations at once (12)")
    add("--turns", type=int, default=8, help="turns per conversation (8)")
    add("--hosts", type=int, default=3, help="llama-server hosts (3)")
    add("--slots", type=int, default=4, help="slots per host, its -np and slots: (4)")
    add("--ctx", type=int, default=32768, help="context of each host, shared by its slots (32768)")
    add("--threads", type=int, default=1, help="CPU threads per host (1)")
    add("--system-words", type=int, default=500, help="words of the shared system prompt (500)")
    add("--user-words", type=int, default=40, help="words of each user message (40)")
    add("--answer-tokens", type=int, default=48, help="max_tokens of every answer (48)")
    add("--policies", default=",".join(POLICIES), help="policies to run, in order")
    add("--no-host-slots", action="store_true", help="leave slots: out of crossbar's config")
    add("--no-replicas", action="store_true", help="skip the two-replica cache_affinity run")
    add("--store", action="store_true", help="add a two-replica run sharing a redis-server")
    add("--workers", action="store_true", help="add a run of one crossbar with two workers")
    add("--llama-server", help="the binary (default: $CROSSBAR_LLAMA_SERVER or the script's)")
    add("--stagger", type=float, default=0.0, help="seconds between agents' starts (0: at once)")
    add("--saves", action="store_true",
        help="also run cache_affinity with hosts started with --slot-save-path")  # fmt: skip
    add("--out", type=Path, help="write everything as JSON here")
    args = parser.parse_args()

    began = time.monotonic()
    binary = llama_server_binary(args.llama_server)
    workdir = tempfile.TemporaryDirectory(prefix="affinity-")
    script = str(REPO / "scripts" / "tiny_models.py")
    subprocess.run([sys.executable, script, workdir.name, MODEL], check=True, stdout=sys.stderr)
    model = Path(workdir.name) / f"{MODEL}.gguf"
    system = "You are a coding agent. " + text(random.Random("system"), args.system_words)

    plan = [(p, 1) for p in args.policies.split(",") if p]
    if args.saves:
        plan.append(("cache_affinity" + SAVES, 1))
    if not args.no_replicas:
        plan.append((REPLICAS, 2))
    if args.store:
        plan.append((SHARED, 2))
    if args.workers:
        plan.append(("cache_affinity" + WORKERS, 1))
    names = [f"gpu-{i + 1}" for i in range(args.hosts)]
    runs, raw = [], {}
    for name, replicas in plan:
        with fleet(args, binary, model, name, replicas) as (hosts, proxies):
            shared = shared_prefix(hosts[0], system)
            started = time.monotonic()
            turns = run_agents(args, proxies, system)
            summary = summarize(name, turns, shared, names, time.monotonic() - started)
        runs.append(summary)
        raw[name] = turns
        print(f"{name}: {summary['prefilled']:,} prefilled, {summary['vs_ideal']:.2f}x ideal, "
              f"{summary['conversations_split']} conversations on two hosts or more, "
              f"{summary['wall_seconds']} s", file=sys.stderr, flush=True)  # fmt: skip

    print(table(runs))
    print()
    for what, met in targets(runs):
        print(f"- {'met' if met else 'NOT met'}: {what}")
    total = time.monotonic() - began
    shape = f"{args.agents} agents x {args.turns} turns, {args.hosts} hosts x {args.slots} slots"
    print(f"\n{shape}; {total:.0f} s in all")
    if args.out:
        doc = {
            "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "llama_server": version(binary),
            "nproc": os.cpu_count(),
            "seconds": round(total, 1),
            "runs": runs,
            "targets": [{"target": what, "met": met} for what, met in targets(runs)],
            "turns": raw,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    workdir.cleanup()


if __name__ == "__main__":
    try:
        main()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"affinity.py: {e.url} answered {e.code}: {e.read()[:300]!r}") from None

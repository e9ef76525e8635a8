"""A busy fleet shared by one heavy client and three light ones, with and without the queue:

    .venv/bin/python benchmarks/contention.py [--seconds 40] [--real [--pin]] [--out FILE]

Three hosts of 2 slots each (the simulator started with ``--slots 2``, every answer
``--tokens`` tokens ``--chunk-interval`` apart: 40 tokens, about 2 s; or, with ``--real``,
three real ``llama-server -np 2`` hosts with a tiny model; ``--pin``: all three on the
last CPU, crossbar and the clients on the others, as hosts with cores of their own would
leave them) behind one crossbar route,
``least_busy``, ``slots: 2`` on every host, ``log_format: json``. Each flow is one named
key of the route (``api_keys`` mappings, priority ``normal``): ``heavy`` keeps 16 requests
going, ``light-1`` to ``light-3`` send one at a time, each the moment the last one ended.
Three runs, each with a fresh crossbar and fresh hosts: ``idle`` (one light flow alone,
``--idle-seconds``), ``queue: false`` (every request sent on at once, the host queues it:
crossbar before issue 24) and ``queue`` (the default: requests wait in crossbar, a freed
slot goes to the flow with the least service lately), ``--seconds`` of load each.

Measured from the client (threads and ``http.client``, one connection per request):

- *wait*: seconds to the answer's head. A host (the simulator, as llama-server) sends it
  once a slot has the request, so this is the wait in crossbar and in the host's queue
  together. ``crossbar wait`` is ``wait_ms`` of the request's JSON access line (matched
  to the request by host, end time and duration; the count matched is in the JSON).
- *first token*: seconds to the first streamed content event.
- *fleet tokens/s*: content events received within the run's seconds, divided by them.
- *Jain's index* over slot-time: a flow's slot-time is the sum over its requests of head
  to end (the time it held a slot), clipped to the run's seconds. Each flow's is divided by
  its max-min fair share: the fleet's slot-seconds (hosts x slots x seconds) water-filled
  over the flows' demands (the requests each keeps going: 16 and 1, 1, 1), so 6 slots
  give each light flow 1 and the heavy one 3. ``J = (sum x)^2 / (n sum x^2)`` over those
  ratios: 1 when every flow has its fair share, 1/n when one flow has everything.

Requests still running at the end are waited for (their tokens past the end do not count);
a run's requests are those sent within its seconds; ``--warmup S`` leaves those sent in the
first S seconds out of the waits and times to first token (every flow starts at once, so the
light flows' first requests always find every slot taken). With a fixed answer length the
simulator's slots free in lockstep, all within a few ms every answer; ``--spread 0.5`` asks
each request for 20 to 60 tokens instead (40 on average), so they free at scattered times,
as real answers do. The targets are issue 24's (item 7).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.affinity_fleet import MODEL, ROUTE, llama_server_binary, version  # noqa: E402
from benchmarks.contention_fleet import HEAVY, KEYS, LIGHT, fleet  # noqa: E402
from tests.support import Daemon  # noqa: E402

RUNS = ("idle", "queue: false", "queue")
OWN, ONE = "own counts", "one crossbar"
"""With ``--replicas``: the queue on but no shared store (each replica counts its own), and
the queue in a single crossbar (what the replicas with a store are held to)."""


# ---------------------------------------------------------------------------- the load


def ask(proxy: Daemon, flow: str, n: int, tokens: int, began: float, end: float) -> dict:
    """One streamed chat completion of ``flow``; its times (from ``began``) and tokens."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{flow} asks question {n}"}],
        "max_tokens": tokens,
        "stream": True,
    }
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEYS[flow]}"}
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=600)
    wall, sent = time.time(), time.perf_counter()
    first, host, status, head = None, "", 0, None
    count = in_time = 0
    try:
        conn.request("POST", f"/{ROUTE}/v1/chat/completions", json.dumps(body), headers)
        response = conn.getresponse()
        head = time.perf_counter()
        host, status = response.getheader("X-Crossbar-Host", ""), response.status
        if status != 200:
            response.read()
        else:
            for line in response:
                if not line.startswith(b"data: {"):
                    continue
                for choice in json.loads(line[6:]).get("choices", ()):
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        first = first or now
                        count += 1
                        in_time += now < end
    except OSError:
        pass  # status 0: no answer
    finally:
        conn.close()
    done = time.perf_counter()
    return {
        "flow": flow,
        "host": host,
        "status": status,
        "wall": wall,
        "sent": round(sent - began, 4),
        "head": None if head is None else round(head - began, 4),
        "first": None if first is None else round(first - began, 4),
        "end": round(done - began, 4),
        "tokens": count,
        "tokens_in_time": in_time,
    }


def load(
    proxies: list[Daemon], flows: dict[str, int], seconds: float, tokens: int, spread: float
) -> list[dict]:
    """Each flow keeps its number of requests going for ``seconds``; every request's record.
    With ``spread``, each asks for ``tokens`` give or take that share, drawn per request
    (the same draws in every run). With several replicas, each of a flow's requests goes to
    the next one (as a load balancer without key hashing sends them)."""
    records: list[dict] = []
    gate = threading.Barrier(sum(flows.values()) + 1)
    clock: list[float] = []

    def worker(flow: str, index: int) -> None:
        draw = random.Random(f"{flow}/{index}")
        low, high = round(tokens * (1 - spread)), round(tokens * (1 + spread))
        gate.wait()
        began, n = clock[0], 0
        while time.perf_counter() < began + seconds:
            n += 1
            asked = draw.randint(low, high) if spread else tokens
            proxy = proxies[(n + index) % len(proxies)]
            records.append(ask(proxy, flow, n, asked, began, began + seconds))

    threads = [
        threading.Thread(target=worker, args=(flow, i), daemon=True)
        for flow, many in flows.items()
        for i in range(many)
    ]
    for thread in threads:
        thread.start()
    clock.append(time.perf_counter())
    gate.wait()
    for thread in threads:
        thread.join()
    return records


def crossbar_waits(proxies: list[Daemon], records: list[dict]) -> int:
    """Give each request the ``wait_ms`` of its access line (same host, started within
    0.5 s, nearest start and then duration first); how many were matched."""
    lines = []
    for text in (line for proxy in proxies for line in proxy.output().splitlines()):
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if line.get("event") == "request" and line.get("route") == ROUTE:
            end = dt.datetime.fromisoformat(line["time"]).timestamp()
            lines.append((line["host"], end, line["ms"] / 1000, line.get("wait_ms")))
    pairs = []
    for i, (host, end, seconds, _) in enumerate(lines):
        for j, r in enumerate(records):
            began = abs(r["wall"] - (end - seconds))  # the client may read the end late
            if r["host"] == host and began < 0.5:
                pairs.append((began + abs(r["end"] - r["sent"] - seconds) / 10, i, j))
    used_lines, used_records = set(), set()
    for _, i, j in sorted(pairs):
        if i not in used_lines and j not in used_records:
            used_lines.add(i)
            used_records.add(j)
            records[j]["crossbar_wait_ms"] = lines[i][3] or 0
    return len(used_records)


# ---------------------------------------------------------------------------- figures


def ms(values: Sequence[float], share: float) -> float | None:
    """The percentile in milliseconds, ``None`` for no values."""
    ordered = sorted(values)
    return (
        round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 1)
        if ordered
        else None
    )


def fair_shares(demands: dict[str, int], slots: int) -> dict[str, float]:
    """Max-min fair slots per flow: water-filled, no flow above its demand."""
    shares, left, open_ = {}, float(slots), dict(demands)
    while open_:
        level = left / len(open_)
        small = {f: d for f, d in open_.items() if d <= level}
        if not small:
            shares.update({f: level for f in open_})
            break
        for flow, demand in small.items():
            shares[flow] = demand
            left -= demand
            del open_[flow]
    return shares


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def summarize(
    name: str, records: list[dict], flows: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    seconds = args.seconds if name != "idle" else args.idle_seconds
    if name == "idle":
        args = argparse.Namespace(**{**vars(args), "warmup": 0})
    ok = [r for r in records if r["status"] == 200 and r["first"] is not None]
    fair = fair_shares(flows, args.hosts * args.slots)
    per_flow, groups = {}, {f: [f] for f in flows}
    if len(flows) > 1:
        groups["light (all)"] = [f for f in flows if f != HEAVY]
    for label, members in groups.items():
        mine = [r for r in ok if r["flow"] in members]
        later = [r for r in mine if r["sent"] >= args.warmup]
        waits = [r["head"] - r["sent"] for r in later]
        first = [r["first"] - r["sent"] for r in later]
        ours = [r["crossbar_wait_ms"] / 1000 for r in later if "crossbar_wait_ms" in r]
        slot_time = sum(max(0.0, min(r["end"], seconds) - r["head"]) for r in mine)
        share = slot_time / (seconds * sum(fair[f] for f in members))
        per_flow[label] = {
            "requests": len(mine),
            "requests_timed": len(later),
            **{f"wait_p{q}_ms": ms(waits, q / 100) for q in (50, 95)},
            **{f"crossbar_wait_p{q}_ms": ms(ours, q / 100) for q in (50, 95)},
            **{f"first_token_p{q}_ms": ms(first, q / 100) for q in (50, 95)},
            "slot_seconds": round(slot_time, 1),
            "of_fair_share": round(share, 3),
        }
    answers = [r["end"] - r["head"] for r in ok]
    return {
        "run": name,
        "seconds": seconds,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "statuses": sorted({r["status"] for r in records}),
        "fleet_tokens_per_second": round(sum(r["tokens_in_time"] for r in ok) / seconds, 1),
        "jain": round(jain([per_flow[f]["of_fair_share"] for f in flows]), 3),
        "answer_p50_ms": ms(answers, 0.5),
        "flows": per_flow,
    }


def table(runs: Sequence[dict[str, Any]]) -> str:
    rows = [
        "| run | flow | requests | wait p50 / p95 ms | crossbar wait p50 / p95 ms "
        "| first token p50 / p95 ms | slot-s | x fair share |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]

    def pair(f: dict[str, Any], what: str) -> str:
        low, high = f[f"{what}_p50_ms"], f[f"{what}_p95_ms"]
        return "-" if low is None else f"{low:.0f} / {high:.0f}"

    for r in runs:
        for flow, f in r["flows"].items():
            rows.append(
                f"| {r['run']} | {flow} | {f['requests']} | {pair(f, 'wait')} "
                f"| {pair(f, 'crossbar_wait')} | {pair(f, 'first_token')} "
                f"| {f['slot_seconds']:.0f} | {f['of_fair_share']:.2f} |"
            )
    rows += ["", "| run | requests | errors | fleet tokens/s | Jain's index | answer p50 ms |"]
    rows.append("|---|--:|--:|--:|--:|--:|")
    for r in runs:
        rows.append(
            f"| {r['run']} | {r['requests']} | {r['errors']} | {r['fleet_tokens_per_second']} "
            f"| {r['jain']:.3f} | {r['answer_p50_ms']:.0f} |"
        )
    return "\n".join(rows)


def replica_targets(idle: dict, one: dict, on: dict) -> list[tuple[str, bool]]:
    """Issue 37's targets for replicas sharing a store, against one crossbar."""
    light = on["flows"]["light (all)"]["first_token_p95_ms"]
    idle_p95 = idle["flows"]["light-1"]["first_token_p95_ms"]
    bound = 1.5 * idle_p95 + 1000
    served, alone = on["requests"], one["requests"]
    return [
        (f"light flows' p95 first token within 1.5x idle's ({idle_p95:.0f} ms) plus 1 s: "
         f"{light:.0f} vs {bound:.0f} ms", light <= bound),
        (f"requests within 5% of one crossbar's ({served} vs {alone}: "
         f"{served / alone - 1:+.1%})", served >= 0.95 * alone),
    ]  # fmt: skip


def targets(runs: Sequence[dict[str, Any]], slots: int) -> list[tuple[str, bool]]:
    """Issue 24's targets (item 7), and whether each is met."""
    by = {r["run"]: r for r in runs}
    idle, off, on = by.get("idle"), by.get("queue: false"), by.get("queue")
    if on and idle and ONE in by:
        return replica_targets(idle, by[ONE], on)
    if not (off and on):
        return []
    light, light_off = (r["flows"]["light (all)"]["first_token_p95_ms"] for r in (on, off))
    tps, tps_off = on["fleet_tokens_per_second"], off["fleet_tokens_per_second"]
    change = tps / tps_off - 1
    found = [
        (f"light flows' p95 first token at most a third of queue: false's ({light:.0f} vs "
         f"{light_off:.0f} ms: {light / light_off:.2f}x)", light <= light_off / 3),
        (f"fleet throughput not more than 5% below queue: false's ({tps} vs {tps_off} "
         f"tokens/s: {change:+.1%})", change >= -0.05),
    ]  # fmt: skip
    if idle:
        # One of ``slots`` slots busy with answers of ``answer`` seconds, each at a uniform
        # point of its own, frees within t with chance 1 - (1 - t/answer)**slots.
        frees = on["answer_p50_ms"] * (1 - 0.05 ** (1 / slots))
        idle_p95 = idle["flows"]["light-1"]["first_token_p95_ms"]
        bound = 1.5 * idle_p95 + frees
        found.append(
            (f"light flows' p95 first token within 1.5x idle's ({idle_p95:.0f} ms) plus one "
             f"slot's p95 time to free ({frees:.0f} ms): {light:.0f} vs {bound:.0f} ms",
             light <= bound)
        )  # fmt: skip
    return found


# ---------------------------------------------------------------------------- main


def pinned(binary: Path, workdir: Path) -> Path:
    """``--pin``: the hosts share the last CPU (``taskset``), this process, its clients and
    crossbar the others. On a small machine the hosts otherwise take the CPU that
    crossbar's dispatch and the clients need, and every wait stretches with their load:
    this stands for hosts with cores of their own (GPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("contention.py: --pin needs two CPUs at least")
    os.sched_setaffinity(0, cpus[:-1])
    wrapper = workdir / "llama-server-pinned"
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c {cpus[-1]} {shlex.quote(str(binary))} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seconds", type=float, default=40, help="seconds of load per run (40)")
    add("--idle-seconds", type=float, default=10, help="seconds of the idle run (10)")
    add("--heavy", type=int, default=16, help="requests the heavy flow keeps going (16)")
    add("--hosts", type=int, default=3, help="hosts (3)")
    add("--slots", type=int, default=2, help="slots per host: slots: and -np (2)")
    add("--tokens", type=int, default=40, help="tokens of every answer (40)")
    add("--spread", type=float, default=0, help="tokens vary by this share per request (0)")
    add("--chunk-interval", type=float, default=0.05, help="simulator: seconds a token (0.05)")
    add("--workers", type=int, default=1, help="crossbar's workers: (1)")
    add("--replicas", type=int, default=1, help="crossbars sharing a redis-server (1)")
    add("--warmup", type=float, default=0, help="waits: leave out requests sent before (0 s)")
    add(
        "--runs",
        help=f"runs, in order (idle,queue: false,queue; --replicas: idle,{ONE},{OWN},queue)",
    )
    add("--real", action="store_true", help="real llama-server hosts (-np SLOTS), tiny model")
    add("--ctx", type=int, default=4096, help="--real: context of each host (4096)")
    add("--threads", type=int, default=1, help="--real: CPU threads per host (1)")
    add("--llama-server", help="--real: the binary (default: $CROSSBAR_LLAMA_SERVER or script's)")
    add("--pin", action="store_true", help="--real: hosts on the last CPU, crossbar on the rest")
    add("--out", type=Path, help="write everything as JSON here")
    args = parser.parse_args()

    began = time.monotonic()
    workdir = tempfile.TemporaryDirectory(prefix="contention-")
    args.workdir = workdir.name
    real, llama = None, None
    if args.real:
        binary = llama_server_binary(args.llama_server)
        script = str(REPO / "scripts" / "tiny_models.py")
        subprocess.run([sys.executable, script, workdir.name, MODEL], check=True, stdout=sys.stderr)
        if args.pin:
            binary = pinned(binary, Path(workdir.name))
        real, llama = (binary, Path(workdir.name) / f"{MODEL}.gguf"), version(binary)

    runs, raw = [], {}
    if args.runs is None:
        args.runs = ",".join(RUNS if args.replicas == 1 else ("idle", ONE, OWN, "queue"))
    for name in (n.strip() for n in args.runs.split(",") if n.strip()):
        flows = {LIGHT[0]: 1} if name == "idle" else {HEAVY: args.heavy, **dict.fromkeys(LIGHT, 1)}
        seconds = args.idle_seconds if name == "idle" else args.seconds
        replicas = 1 if name in ("idle", ONE) else args.replicas
        queue, store = name != "queue: false", name != OWN
        with fleet(args, queue, real, store, replicas) as proxies:
            records = load(proxies, flows, seconds, args.tokens, args.spread)
        matched = crossbar_waits(proxies, records)
        summary = summarize(name, records, flows, args)
        summary["access_lines_matched"] = matched
        runs.append(summary)
        raw[name] = records
        print(f"{name}: {len(records)} requests, {summary['fleet_tokens_per_second']} tokens/s, "
              f"{matched} matched to access lines", file=sys.stderr, flush=True)  # fmt: skip

    print(table(runs))
    print()
    found = targets(runs, args.hosts * args.slots)
    for what, met in found:
        print(f"- {'met' if met else 'NOT met'}: {what}")
    total = time.monotonic() - began
    fleet_shape = "llama-server" if args.real else "simulator"
    print(f"\n{args.hosts} {fleet_shape} hosts x {args.slots} slots, {args.tokens} tokens an "
          f"answer, {args.seconds:g} s a run; {total:.0f} s in all")  # fmt: skip
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k != "workdir"}
        doc = {
            "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in settings.items()},
            "llama_server": llama,
            "nproc": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "seconds": round(total, 1),
            "runs": runs,
            "targets": [{"target": what, "met": met} for what, met in found],
            "requests": raw,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    workdir.cleanup()


if __name__ == "__main__":
    main()

"""A busy fleet shared by one heavy client and three light ones, with and without the queue:

    .venv/bin/python benchmarks/contention.py [--seconds 40] [--real] [--out FILE]

Three hosts of 2 slots each (the simulator started with ``--slots 2``, every answer
``--tokens`` tokens ``--chunk-interval`` apart: 40 tokens, about 2 s; or, with ``--real``,
three real ``llama-server -np 2`` hosts with a tiny model) behind one crossbar route,
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
a run's requests are those sent within its seconds. The targets are issue 24's (item 7).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.affinity_fleet import (  # noqa: E402
    MODEL,
    ROUTE,
    fleet_ready,
    get_json,
    llama_server_binary,
    start_host,
    version,
)
from tests.support import Daemon, free_port, start_daemon  # noqa: E402

HEAVY, LIGHT = "heavy", ("light-1", "light-2", "light-3")
KEYS = {name: f"contention-{name}-0123456789abcdef" for name in (HEAVY, *LIGHT)}
RUNS = ("idle", "queue: false", "queue")


# ---------------------------------------------------------------------------- processes


def crossbar_yaml(urls: Sequence[str], slots: int, queue: bool) -> str:
    names = [f"gpu-{i + 1}" for i in range(len(urls))]
    lines = ["log_format: json", "poll_interval: 250ms", "hosts:"]
    for name, url in zip(names, urls, strict=True):
        lines += [f"  {name}:", f"    url: {url}", f"    slots: {slots}"]
    lines += [
        "routes:",
        f"  {ROUTE}:",
        f"    hosts: [{', '.join(names)}]",
        f"    default_model: {MODEL}",
        "    policy: least_busy",
        *(["    queue: false"] if not queue else []),
        "    api_keys:",
        *(f'      - {{name: {name}, key: "{key}"}}' for name, key in KEYS.items()),
    ]
    return "\n".join(lines) + "\n"


def start_simulator(args: argparse.Namespace, workdir: Path) -> tuple[Daemon, list[str]]:
    """One simulator process serving ``--hosts`` hosts (``--host PORT:MODELS`` for each more)."""
    ports = [free_port() for _ in range(args.hosts)]
    argv = [sys.executable, "-m", "crossbar.testing.simulator", "--listen", str(ports[0])]
    argv += ["--models", f"{MODEL}=loaded", "--slots", str(args.slots)]
    argv += ["--chunks", str(args.tokens), "--chunk-interval", str(args.chunk_interval)]
    for port in ports[1:]:
        argv += ["--host", f"{port}:{MODEL}=loaded"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sim = Daemon.start(argv, ports[0], workdir / "simulator.log", cwd=workdir, env=env)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    if not sim.wait(lambda: all(get_json(f"{u}/health") for u in urls), 30):
        sim.stop()
        raise SystemExit(f"contention.py: the simulator did not start:\n{sim.log()}")
    return sim, urls


@contextmanager
def fleet(args: argparse.Namespace, queue: bool, real: Any) -> Iterator[Daemon]:
    """Fresh hosts and a fresh crossbar for one run, stopped afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="contention-", dir=args.workdir))
    hosts: list[Daemon] = []
    proxy: Daemon | None = None
    try:
        if real is None:
            sim, urls = start_simulator(args, workdir)
            hosts.append(sim)
        else:
            binary, model = real
            hosts += [start_host(args, binary, model, workdir) for _ in range(args.hosts)]
            urls = [host.url for host in hosts]
        (workdir / "crossbar").mkdir()
        proxy = start_daemon(workdir / "crossbar", crossbar_yaml(urls, args.slots, queue))
        if not proxy.wait(lambda: fleet_ready(proxy, len(urls)), 30):
            raise SystemExit(f"contention.py: crossbar never saw every host up:\n{proxy.log()}")
        yield proxy
    finally:
        for daemon in ([proxy] if proxy else []) + hosts:
            daemon.stop()


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


def load(proxy: Daemon, flows: dict[str, int], seconds: float, tokens: int) -> list[dict]:
    """Each flow keeps its number of requests going for ``seconds``; every request's record."""
    records: list[dict] = []
    gate = threading.Barrier(sum(flows.values()) + 1)
    clock: list[float] = []

    def worker(flow: str) -> None:
        gate.wait()
        began, n = clock[0], 0
        while time.perf_counter() < began + seconds:
            n += 1
            records.append(ask(proxy, flow, n, tokens, began, began + seconds))

    threads = [
        threading.Thread(target=worker, args=(flow,), daemon=True)
        for flow, many in flows.items()
        for _ in range(many)
    ]
    for thread in threads:
        thread.start()
    clock.append(time.perf_counter())
    gate.wait()
    for thread in threads:
        thread.join()
    return records


def crossbar_waits(proxy: Daemon, records: list[dict]) -> int:
    """Give each request the ``wait_ms`` of its access line (same host, end and duration
    within 0.25 s, nearest first); how many were matched."""
    lines = []
    for text in proxy.output().splitlines():
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
            mine = r["end"] - r["sent"]
            cost = abs(r["wall"] + mine - end) + abs(mine - seconds)
            if r["host"] == host and cost < 0.25:
                pairs.append((cost, i, j))
    used_lines, used_records = set(), set()
    for _, i, j in sorted(pairs):
        if i not in used_lines and j not in used_records:
            used_lines.add(i)
            used_records.add(j)
            records[j]["crossbar_wait_ms"] = lines[i][3] or 0
    return len(used_records)


# ---------------------------------------------------------------------------- figures


def percentile(values: Sequence[float], share: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else None


def ms(values: Sequence[float], share: float) -> float | None:
    value = percentile(values, share)
    return None if value is None else round(value * 1000, 1)


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
    ok = [r for r in records if r["status"] == 200 and r["first"] is not None]
    fair = fair_shares(flows, args.hosts * args.slots)
    per_flow, groups = {}, {f: [f] for f in flows}
    if len(flows) > 1:
        groups["light (all)"] = [f for f in flows if f != HEAVY]
    for label, members in groups.items():
        mine = [r for r in ok if r["flow"] in members]
        waits = [r["head"] - r["sent"] for r in mine]
        first = [r["first"] - r["sent"] for r in mine]
        ours = [r["crossbar_wait_ms"] / 1000 for r in mine if "crossbar_wait_ms" in r]
        slot_time = sum(max(0.0, min(r["end"], seconds) - r["head"]) for r in mine)
        share = slot_time / (seconds * sum(fair[f] for f in members))
        per_flow[label] = {
            "requests": len(mine),
            "wait_p50_ms": ms(waits, 0.5),
            "wait_p95_ms": ms(waits, 0.95),
            "crossbar_wait_p50_ms": ms(ours, 0.5),
            "crossbar_wait_p95_ms": ms(ours, 0.95),
            "first_token_p50_ms": ms(first, 0.5),
            "first_token_p95_ms": ms(first, 0.95),
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


def targets(runs: Sequence[dict[str, Any]], slots: int) -> list[tuple[str, bool]]:
    """Issue 24's targets (item 7), and whether each is met."""
    by = {r["run"]: r for r in runs}
    idle, off, on = by.get("idle"), by.get("queue: false"), by.get("queue")
    if not (off and on):
        return []
    light_on = on["flows"]["light (all)"]["first_token_p95_ms"]
    light_off = off["flows"]["light (all)"]["first_token_p95_ms"]
    found = [
        (
            f"light flows' p95 first token at most a third of queue: false's "
            f"({light_on:.0f} vs {light_off:.0f} ms: {light_on / light_off:.2f}x)",
            light_on <= light_off / 3,
        )
    ]
    tps_on, tps_off = on["fleet_tokens_per_second"], off["fleet_tokens_per_second"]
    change = tps_on / tps_off - 1
    found.append(
        (
            f"fleet throughput within 5% of queue: false's ({tps_on} vs {tps_off} tokens/s: "
            f"{change:+.1%})",
            abs(change) <= 0.05,
        )
    )
    if idle:
        # One of ``slots`` slots busy with answers of ``answer`` seconds, each at a uniform
        # point of its own, frees within t with chance 1 - (1 - t/answer)**slots.
        answer = on["answer_p50_ms"]
        frees = answer * (1 - 0.05 ** (1 / slots))
        idle_p95 = idle["flows"]["light-1"]["first_token_p95_ms"]
        bound = 1.5 * idle_p95 + frees
        found.append(
            (
                f"light flows' p95 first token within 1.5x idle's ({idle_p95:.0f} ms) plus "
                f"one slot's p95 time to free ({frees:.0f} ms): {light_on:.0f} vs "
                f"{bound:.0f} ms",
                light_on <= bound,
            )
        )
    return found


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seconds", type=float, default=40, help="seconds of load per run (40)")
    add("--idle-seconds", type=float, default=10, help="seconds of the idle run (10)")
    add("--heavy", type=int, default=16, help="requests the heavy flow keeps going (16)")
    add("--hosts", type=int, default=3, help="hosts (3)")
    add("--slots", type=int, default=2, help="slots per host: slots: and -np (2)")
    add("--tokens", type=int, default=40, help="tokens of every answer (40)")
    add("--chunk-interval", type=float, default=0.05, help="simulator: seconds a token (0.05)")
    add("--runs", default=",".join(RUNS), help="runs, in order (idle,queue: false,queue)")
    add("--real", action="store_true", help="real llama-server hosts (-np SLOTS), tiny model")
    add("--ctx", type=int, default=4096, help="--real: context of each host (4096)")
    add("--threads", type=int, default=1, help="--real: CPU threads per host (1)")
    add("--llama-server", help="--real: the binary (default: $CROSSBAR_LLAMA_SERVER or script's)")
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
        real, llama = (binary, Path(workdir.name) / f"{MODEL}.gguf"), version(binary)

    runs, raw = [], {}
    for name in (n.strip() for n in args.runs.split(",") if n.strip()):
        flows = {LIGHT[0]: 1} if name == "idle" else {HEAVY: args.heavy, **dict.fromkeys(LIGHT, 1)}
        seconds = args.idle_seconds if name == "idle" else args.seconds
        with fleet(args, name != "queue: false", real) as proxy:
            records = load(proxy, flows, seconds, args.tokens)
        matched = crossbar_waits(proxy, records)
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

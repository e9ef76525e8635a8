"""Which host loads which model: today's ``priority`` against the new placement, side by side:

    .venv/bin/python benchmarks/placement.py [--turns 6] [--real] [--models-max 2] [--out FILE]

Three router hosts with ``--models-max 2`` (the simulator: a load takes ``--load-time`` 2 s,
answers ``--tokens`` 20 tokens ``--chunk-interval`` 20 ms apart; or, with ``--real``, three real
``llama-server`` routers over the tiny models of ``scripts/tiny_models.py``), all knowing four
models of skewed popularity: ``m-a`` has 4 agents, ``m-b`` 2, ``m-c`` and ``m-d`` 1 each. Each
agent is bound to its model and holds one conversation of ``--turns`` streamed turns, ``--think``
seconds apart (agents start 0.1 s apart). At the start ``m-a`` is loaded on ``gpu-1`` and nothing
else anywhere. One crossbar route, ``priority``, hosts ``[gpu-1, gpu-2, gpu-3]``. The issue's
own setup is ``--hosts 2 --models-max 1 --agents m-a=3,m-b=3``.

Two runs, each with fresh hosts and a fresh crossbar:

- ``priority (today)``: crossbar as of ``--baseline-rev`` (default the last commit before
  placement, :data:`BEFORE`), exported from this
  repository with ``git archive``: a model loaded nowhere goes to the first healthy host that
  knows it, whatever that host runs;
- ``priority + placement``: this checkout, which reads each router's room (``GET /props``) and
  loads a model loaded nowhere on the cheapest host (``crossbar.routing.placement``).

Measured from outside crossbar, the same way for both: the benchmark polls every host's own
``/v1/models`` every 100 ms; a *load* is a model going to ``loading`` (or straight to ``loaded``),
an *eviction* a ``loaded`` model going to ``unloaded``. A request *waited for a load* when its
host was loading its model between the request's send and its first token. Time to first token
is the client's, to the first streamed content event. The unavoidable loads are those of the
models loaded nowhere at the start (3), the fleet having room for all four. On the simulator,
a request *waited on a full host* when its host had to load its model and every model loaded
there was busy (the router holds it until one is idle): counted by the hosts themselves
(``GET /_simulator/counts``).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BEFORE = "b6c421b"
"""main just before placement was merged: the baseline, a model going to the first host."""

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.affinity_fleet import get_json, llama_server_binary, version  # noqa: E402
from tests.support import TWISTD, Daemon, accepts, free_port  # noqa: E402

MODELS = {"m-a": 4, "m-b": 2, "m-c": 1, "m-d": 1}
"""Agents per model: skewed popularity."""
ROUTE = "bench"
RUNS = ("priority (today)", "priority + placement")


# ---------------------------------------------------------------------------- the fleet


def crossbar_yaml(urls: list[str], port: int) -> str:
    names = [f"gpu-{i + 1}" for i in range(len(urls))]
    lines = [f'listen: "tcp:{port}:interface=127.0.0.1"', "poll_interval: 250ms", "hosts:"]
    lines += [f"  {name}: {url}" for name, url in zip(names, urls, strict=True)]
    lines += ["routes:", f"  {ROUTE}:", f"    hosts: [{', '.join(names)}]", "    policy: priority"]
    return "\n".join(lines) + "\n"


def export(rev: str, into: Path) -> Path:
    """``rev`` of this repository, as files in ``into``: the crossbar of that commit."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def start_crossbar(source: Path, urls: list[str], workdir: Path) -> Daemon:
    """crossbar from ``source`` (a checkout) under twistd, in ``workdir``."""
    port = free_port()
    (workdir / "crossbar.yaml").write_text(crossbar_yaml(urls, port))
    argv = [TWISTD, "-n", "--pidfile=", "crossbar", "-c", "crossbar.yaml"]
    env = {**os.environ, "PYTHONPATH": str(source)}
    proxy = Daemon.start(argv, port, workdir / "crossbar.log", cwd=workdir, env=env)
    if not proxy.wait(lambda: accepts(port), 30):
        raise SystemExit(f"placement.py: crossbar did not start:\n{proxy.output()}")
    return proxy


def start_simulator(args: argparse.Namespace, workdir: Path) -> tuple[list[Daemon], list[str]]:
    ports = [free_port() for _ in range(args.hosts)]
    spec = ",".join(f"{m}={'loaded' if m == 'm-a' else 'unloaded'}" for m in args.agents)
    rest = ",".join(args.agents)
    argv = [sys.executable, "-m", "crossbar.testing.simulator", "--listen", str(ports[0])]
    argv += ["--models", spec, "--models-max", str(args.models_max)]
    argv += ["--load-time", str(args.load_time), "--unload-time", "0.1"]
    argv += ["--chunks", str(args.tokens), "--chunk-interval", str(args.chunk_interval)]
    for port in ports[1:]:
        argv += ["--host", f"{port}:{rest}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sim = Daemon.start(argv, ports[0], workdir / "simulator.log", cwd=workdir, env=env)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    if not sim.wait(lambda: all(get_json(f"{u}/health") for u in urls), 30):
        sim.stop()
        raise SystemExit(f"placement.py: the simulator did not start:\n{sim.log()}")
    return [sim], urls


def start_routers(args: argparse.Namespace, workdir: Path) -> tuple[list[Daemon], list[str]]:
    binary = llama_server_binary(args.llama_server)
    models = workdir / "models"
    script = REPO / "scripts" / "tiny_models.py"
    subprocess.run([sys.executable, str(script), str(models), *args.agents], check=True)
    routers: list[Daemon] = []
    for _ in range(args.hosts):
        port = free_port()
        argv = [str(binary), "--models-dir", str(models), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--models-max", str(args.models_max), "-np", "2"]
        argv += ["-c", "4096", "-t", "1", "-tb", "1"]
        env = {**os.environ, "LLAMA_CACHE": str(workdir / "cache")}
        env.pop("LLAMA_ARG_MODELS_DIR", None)
        router = Daemon.start(argv, port, workdir / f"router-{port}.log", cwd=workdir, env=env)
        routers.append(router)
        if not router.wait(lambda r=router: get_json(f"{r.url}/health") is not None, 60):
            raise SystemExit(f"placement.py: llama-server did not start:\n{router.log()}")
    first = routers[0].url
    request("POST", f"{first}/models/load", {"model": "m-a"})
    if not routers[0].wait(lambda: statuses(first).get("m-a") == "loaded", 60):
        raise SystemExit("placement.py: m-a did not load on gpu-1")
    return routers, [r.url for r in routers]


@contextmanager
def fleet(args: argparse.Namespace, run: str, baseline: Path) -> Iterator[tuple[Daemon, list[str]]]:
    workdir = Path(tempfile.mkdtemp(prefix="placement-", dir=args.workdir))
    hosts: list[Daemon] = []
    proxy: Daemon | None = None
    try:
        hosts, urls = (start_routers if args.real else start_simulator)(args, workdir)
        source = baseline if run == RUNS[0] else REPO
        proxy = start_crossbar(source, urls, workdir)
        ready = get_status(proxy, len(urls))
        if not proxy.wait(ready, 30):
            raise SystemExit(f"placement.py: crossbar never saw the hosts up:\n{proxy.output()}")
        yield proxy, urls
    finally:
        for daemon in ([proxy] if proxy else []) + hosts:
            daemon.stop()


def get_status(proxy: Daemon, count: int) -> Any:
    def ready() -> bool:
        hosts = (get_json(f"{proxy.url}/_crossbar/status") or {}).get("hosts", {})
        return len(hosts) == count and all(h["healthy"] for h in hosts.values())

    return ready


# ---------------------------------------------------------------------------- the watch


def request(method: str, url: str, body: Any = None) -> Any:
    host, _, rest = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=10)
    try:
        conn.request(method, "/" + rest, None if body is None else json.dumps(body))
        return json.loads(conn.getresponse().read() or b"null")
    finally:
        conn.close()


def statuses(url: str) -> dict[str, str]:
    entries = (get_json(f"{url}/v1/models") or {}).get("data", [])
    return {m["id"]: (m.get("status") or {}).get("value", "loaded") for m in entries}


class Watch(threading.Thread):
    """Every host's models, every 100 ms: loads, evictions, and when each load ran."""

    def __init__(self, urls: list[str], began: float) -> None:
        super().__init__(daemon=True)
        self.urls, self.began = urls, began
        self.loads: dict[str, int] = {}
        self.evictions: dict[str, int] = {}
        self.loading: list[tuple[str, str, float, float]] = []  # host, model, from, until
        self.stopped = threading.Event()

    def run(self) -> None:
        last = {url: statuses(url) for url in self.urls}
        started: dict[tuple[str, str], float] = {}
        while not self.stopped.wait(0.1):
            now = time.perf_counter() - self.began
            for i, url in enumerate(self.urls):
                host, seen = f"gpu-{i + 1}", statuses(url)
                for model, status in seen.items():
                    was = last[url].get(model, "unloaded")
                    if status in ("loading", "loaded") and was not in ("loading", "loaded"):
                        self.loads[host] = self.loads.get(host, 0) + 1
                        started[host, model] = now - 0.05
                    if status == "loaded" and (host, model) in started:
                        self.loading.append((host, model, started.pop((host, model)), now))
                    if was == "loaded" and status == "unloaded":
                        self.evictions[host] = self.evictions.get(host, 0) + 1
                last[url] = seen


# ---------------------------------------------------------------------------- the load


def ask(port: int, model: str, messages: list[dict], tokens: int, began: float) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": tokens, "stream": True}
    body |= {"temperature": 0.8, "seed": 7}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.perf_counter() - began
    first, text, host, status = None, [], "", 0
    try:
        conn.request("POST", f"/{ROUTE}/v1/chat/completions", json.dumps(body))
        response = conn.getresponse()
        host, status = response.getheader("X-Crossbar-Host", ""), response.status
        for line in response:
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices", ()):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first = first or time.perf_counter() - began
                        text.append(piece)
    except OSError:
        pass
    finally:
        conn.close()
    end = time.perf_counter() - began
    return {"model": model, "host": host, "status": status, "sent": sent, "first": first,
            "end": end, "text": "".join(text)}  # fmt: skip


def agents(port: int, args: argparse.Namespace, began: float) -> list[dict]:
    records: list[dict] = []

    def agent(model: str, index: int) -> None:
        time.sleep(0.1 * index)
        messages = [{"role": "system", "content": f"You are agent {index} on {model}."}]
        for turn in range(args.turns):
            messages.append({"role": "user", "content": f"turn {turn}: go on"})
            record = ask(port, model, messages, args.tokens, began)
            records.append(record)
            messages.append({"role": "assistant", "content": record["text"]})
            time.sleep(args.think)

    pairs = [(m, n) for m, many in args.agents.items() for n in range(many)]
    threads = [
        threading.Thread(target=agent, args=(m, i), daemon=True) for i, (m, _) in enumerate(pairs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records


def agents_of(spec: str) -> dict[str, int]:
    """``m-a=3,m-b=3`` -> {"m-a": 3, "m-b": 3}."""
    pairs = (item.partition("=") for item in spec.split(",") if item)
    return {name: int(many) for name, _, many in pairs}


def percentile(values: list[float], share: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000)


def summarize(
    records: list[dict], watch: Watch, seconds: float, models: dict[str, int]
) -> dict[str, Any]:
    ok = [r for r in records if r["status"] == 200 and r["first"] is not None]

    def waited(r: dict) -> bool:
        return any(
            host == r["host"] and model == r["model"] and start < r["first"] and until > r["sent"]
            for host, model, start, until in watch.loading
        )

    ttft = {m: [r["first"] - r["sent"] for r in ok if r["model"] == m] for m in models}
    every = [t for ts in ttft.values() for t in ts]
    hosts: dict[str, dict[str, int]] = {}
    for r in ok:
        hosts.setdefault(r["host"], {}).setdefault(r["model"], 0)
        hosts[r["host"]][r["model"]] += 1
    return {
        "requests": len(records),
        "answered": len(ok),
        "loads": sum(watch.loads.values()),
        "loads_by_host": dict(sorted(watch.loads.items())),
        "evictions": sum(watch.evictions.values()),
        "waited_for_a_load": sum(waited(r) for r in ok),
        "ttft_p50_ms": percentile(every, 0.5),
        "ttft_p95_ms": percentile(every, 0.95),
        "ttft_p95_ms_by_model": {m: percentile(ts, 0.95) for m, ts in ttft.items()},
        "requests_by_host_and_model": dict(sorted(hosts.items())),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--models-max", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--think", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--load-time", type=float, default=2.0)
    parser.add_argument("--chunk-interval", type=float, default=0.02)
    parser.add_argument("--real", action="store_true", help="real llama-server routers")
    parser.add_argument("--llama-server", help="the binary (default: scripts/llama-server.sh's)")
    parser.add_argument("--baseline-rev", default=BEFORE, help="today's crossbar (git revision)")
    parser.add_argument(
        "--agents",
        type=agents_of,
        default=MODELS,
        help="agents per model, e.g. m-a=3,m-b=3 (m-a starts loaded on gpu-1)",
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    baseline = export(args.baseline_rev, Path(tempfile.mkdtemp(prefix="placement-base-")))
    results: dict[str, Any] = {
        "setup": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")}
        | {"hosts_kind": "llama-server" if args.real else "simulator"},
    }
    if args.real:
        results["setup"]["llama_server"] = version(llama_server_binary(args.llama_server))
    for run in RUNS:
        with fleet(args, run, baseline) as (proxy, urls):
            began = time.perf_counter()
            watch = Watch(urls, began)
            watch.start()
            records = agents(proxy.port, args, began)
            seconds = time.perf_counter() - began
            time.sleep(0.3)
            watch.stopped.set()
            watch.join()
            results[run] = summarize(records, watch, seconds, args.agents)
            if not args.real:  # the simulator counts what no poll from outside can see
                counts = [request("GET", f"{url}/_simulator/counts") for url in urls]
                results[run]["waited_on_a_full_host"] = sum(c["room_waits"] for c in counts)
        print(f"{run}: {json.dumps(results[run])}", flush=True)
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""Several crossbar replicas behind HAProxy, run with ``contrib/haproxy.cfg`` unchanged
(its addresses and check interval set through its environment variables): a replica
killed mid-load costs only the streams it was serving, HAProxy's checks on readyz take it
out and bring it back, every replica sends a conversation to the same host, and each key
(or, without one, each client address) is served by one replica."""

from __future__ import annotations

import contextlib
import csv
import http.client
import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from tests.support import REPO, Daemon, accepts, free_port, start_daemon, start_simulator
from tests.support.errors import api_error

CONFIG = REPO / "contrib" / "haproxy.cfg"
CHAT = "/lab/v1/chat/completions"
REPLICAS = ("replica1", "replica2")
SERVED = " POST /v1/chat/completions 200 "
"""What crossbar's access line of a chat request it served holds."""
APART = {"replica1": "agent-1", "replica2": "agent-0"}
"""A key HAProxy's hash sends to each replica (the test of the hash checks it): clients
that send them reach both replicas."""


def haproxy_binary() -> str:
    """Debian's haproxy; the test is skipped without it, except in CI, which must run it."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(
                "haproxy is not installed, and CI must run this test: apt-get install haproxy"
            )
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy)")
    return found


def wait_until(check: Callable[[], object], what: str, limit: float = 15.0) -> float:
    """Poll other processes' state until ``check()`` holds; the time it did."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic()


@attrs.define
class Balancer:
    """HAProxy running ``contrib/haproxy.cfg``, and the crossbar replicas behind it."""

    tmp: Path
    yaml: str
    port: int
    stats_port: int
    replica_ports: dict[str, int]
    daemons: list[Daemon] = attrs.Factory(list)
    replicas: dict[str, Daemon] = attrs.Factory(dict)

    def states(self, backend: str = "crossbar") -> dict[str, str]:
        """Each server of ``backend`` and its state as HAProxy's stats say (UP, DOWN...)."""
        url = f"http://127.0.0.1:{self.stats_port}/;csv"
        with urllib.request.urlopen(url, timeout=5) as r:
            rows = csv.DictReader(r.read().decode().removeprefix("# ").splitlines())
            servers = (row for row in rows if row["pxname"] == backend)
            return {row["svname"]: row["status"] for row in servers if row["svname"] in REPLICAS}

    def start_replica(self, name: str) -> Daemon:
        """A crossbar on the replica's port, in a directory (and with a log) of its own."""
        directory = self.tmp / f"{name}-{len(list(self.tmp.glob(name + '-*')))}"
        directory.mkdir()
        port = self.replica_ports[name]
        daemon = start_daemon(
            directory, f'listen: "tcp:{port}:interface=127.0.0.1"\n{self.yaml}', port=port
        )
        self.daemons.append(daemon)
        self.replicas[name] = daemon
        return daemon


@contextlib.contextmanager
def balancer(tmp: Path, extra_hosts: str = "", extra_routes: str = "") -> Iterator[Balancer]:
    """Two simulated hosts (answers paced at 50 ms a token, 30 tokens), two crossbar
    replicas with the same config, and HAProxy in front of them."""
    binary = haproxy_binary()
    second = free_port()
    pacing = ("--chunks", "30", "--chunk-interval", "0.05", "--slots", "64")
    sim = start_simulator(
        tmp, "--models", "tiny-a=loaded", "--host", f"{second}:tiny-a=loaded", *pacing
    )
    yaml = (
        f"poll_interval: 500ms\nhosts:\n  gpu-a: {sim.url}\n  gpu-b: http://127.0.0.1:{second}\n"
        f"{extra_hosts}routes:\n  lab:\n    hosts: [gpu-a, gpu-b]\n    default_model: tiny-a\n"
        f"    policy: cache_affinity\n{extra_routes}"
    )
    ports = {name: free_port() for name in REPLICAS}
    lb = Balancer(tmp, yaml, free_port(), free_port(), ports, [sim])
    try:
        for name in REPLICAS:
            lb.start_replica(name)
        _start_haproxy(lb, binary)
        yield lb
    finally:
        for daemon in lb.daemons:
            daemon.stop()


def _start_haproxy(lb: Balancer, binary: str) -> None:
    """HAProxy in front of the replicas. A port found free may be taken by another process
    before HAProxy binds it: then it starts again on fresh ports (at most three times)."""
    args = [binary, "-db", "-f", str(CONFIG)]
    for attempt in range(3):
        env = dict(
            os.environ,
            CROSSBAR_FRONT=f"127.0.0.1:{lb.port}",
            CROSSBAR_REPLICA_1=f"127.0.0.1:{lb.replica_ports['replica1']}",
            CROSSBAR_REPLICA_2=f"127.0.0.1:{lb.replica_ports['replica2']}",
            CROSSBAR_LB_STATS=f"127.0.0.1:{lb.stats_port}",
            CROSSBAR_LB_LOG="stdout",
            CROSSBAR_LB_UNPRIVILEGED="1",
        )
        proxy = Daemon.start(args, lb.port, lb.tmp / "haproxy.log", cwd=lb.tmp, env=env)
        lb.daemons.append(proxy)
        if proxy.wait(lambda: accepts(lb.port) and accepts(lb.stats_port), 10):
            return
        taken = "Address already in use" in proxy.output()
        assert taken and attempt < 2, proxy.log()
        proxy.stop()
        lb.port, lb.stats_port = free_port(), free_port()


# -- clients ------------------------------------------------------------------------------------


@attrs.define
class Outcome:
    """One request through HAProxy, as its client saw it (times from ``time.monotonic``)."""

    kind: str  # "stream" or "plain"
    started: float
    first_byte: float | None = None
    ended: float | None = None
    status: int | None = None
    replica: str | None = None  # X-Served-By, set by HAProxy
    host: str | None = None  # X-Crossbar-Host, set by crossbar
    complete: bool = False
    error: str = ""

    def in_flight(self, moment: float) -> bool:
        return self.started < moment and (self.ended is None or self.ended > moment)


def ask(
    port: int,
    kind: str,
    conversation: str,
    out: Outcome | None = None,
    key: str | None = None,
    path: str = CHAT,
) -> Outcome:
    """A chat request through HAProxy, a stream (1.5 s of events) or a plain one (0.1 s),
    written into ``out`` as it goes; with ``key`` as ``Authorization: Bearer``, or as
    ``x-api-key`` when it is written ``x-api-key:<key>``."""
    body: dict[str, object] = {"messages": [{"role": "user", "content": conversation}]}
    body.update({"stream": True} if kind == "stream" else {"max_tokens": 2})
    out = out or Outcome(kind, time.monotonic())
    headers = {"Content-Type": "application/json"}
    if key is not None and key.startswith("x-api-key:"):
        headers["X-Api-Key"] = key.removeprefix("x-api-key:")
    elif key is not None:
        headers["Authorization"] = f"Bearer {key}"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", path, json.dumps(body), headers)
        response = connection.getresponse()
        out.status = response.status
        out.replica = response.getheader("X-Served-By")
        out.host = response.getheader("X-Crossbar-Host")
        first = response.read1(65536)
        out.first_byte = time.monotonic()
        data = first + response.read()
        if kind == "stream":
            out.complete = out.status == 200 and data.rstrip().endswith(b"data: [DONE]")
        else:
            out.complete = out.status == 200 and bool(json.loads(data)["choices"])
    except (OSError, http.client.HTTPException, ValueError) as e:
        out.error = repr(e)
    finally:
        out.ended = time.monotonic()
        connection.close()
    return out


class Load:
    """A few clients, each sending its requests one after another until told to stop
    (or ``limit`` requests in all): a bounded load. Every other client sends a key that
    goes to the other replica (:data:`APART`)."""

    def __init__(self, port: int, streams: int, plains: int, limit: int = 800) -> None:
        self.port, self.limit = port, limit
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        kinds = ["stream"] * streams + ["plain"] * plains
        self._threads = [
            threading.Thread(target=self._client, args=(i, kind), daemon=True)
            for i, kind in enumerate(kinds)
        ]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def _client(self, client: int, kind: str) -> None:
        n, key = 0, APART[REPLICAS[client % 2]]
        while not self._stop.is_set() and len(self.outcomes) < self.limit:
            n += 1
            out = Outcome(kind, time.monotonic())
            with self._lock:
                self.outcomes.append(out)
            ask(self.port, kind, f"client {client} request {n}", out, key)

    def count(self, check: Callable[[Outcome], bool]) -> int:
        """How many requests so far pass ``check``."""
        with self._lock:
            return sum(1 for o in self.outcomes if check(o))

    def fresh_streams(self, within: float = 0.6) -> dict[str, list[Outcome]]:
        """Streams open now whose first event came in the last ``within`` seconds (so a
        second of their 1.5 s is still to come), by replica."""
        now, found = time.monotonic(), dict[str, list[Outcome]]()
        with self._lock:
            for o in self.outcomes:
                opened = o.first_byte if o.ended is None and o.kind == "stream" else None
                if opened and o.replica and now - opened < within:
                    found.setdefault(o.replica, []).append(o)
        return found


def served(daemon: Daemon) -> int:
    """Chat requests a replica's access log says it answered with 200."""
    return daemon.output().count(SERVED)


# -- the tests ----------------------------------------------------------------------------------


def test_a_killed_replica_costs_only_its_streams_and_comes_back(tmp_path: Path) -> None:
    with balancer(tmp_path) as lb:
        wait_until(lambda: set(lb.states().values()) == {"UP"}, "both replicas UP")
        victim, other = lb.replicas["replica1"], lb.replicas["replica2"]
        with Load(lb.port, streams=4, plains=3) as load:
            fresh: dict[str, list[Outcome]] = {}

            def on_both() -> bool:
                fresh.clear()
                fresh.update(load.fresh_streams())
                return len(fresh) == 2

            wait_until(on_both, "a stream just begun on each replica")
            killed = time.monotonic()
            victim.proc.kill()
            victim.proc.wait(5)
            marked_down = wait_until(
                lambda: lb.states()["replica1"].startswith("DOWN"), "HAProxy to mark replica1 down"
            )
            wait_until(
                lambda: load.count(lambda o: o.started > marked_down and o.ended is not None) >= 20,
                "requests after the down-mark",
            )
            restarted = time.monotonic()
            again = lb.start_replica("replica1")
            back_up = wait_until(lambda: lb.states()["replica1"] == "UP", "replica1 UP again")
            wait_until(
                lambda: (
                    load.count(
                        lambda o: o.started > back_up and o.replica == "replica1" and o.complete
                    )
                    >= 5
                ),
                "replica1 to serve again",
            )
        outcomes = load.outcomes
        assert all(o.ended is not None for o in outcomes)

        # The streams replica1 was serving broke, as they must: no [DONE], no last chunk.
        assert fresh["replica1"] and not any(o.complete for o in fresh["replica1"])
        # Everything else succeeded, in full: replica2's streams at the kill, every
        # request started between the kill and the down-mark (sent again elsewhere) and
        # after it. (Of replica1's streams at the kill, one that was ending may have ended.)
        at_kill = [o for o in outcomes if o.replica == "replica1" and o.in_flight(killed)]
        others = [o for o in outcomes if not (o in at_kill and o.kind == "stream")]
        assert [o for o in others if not o.complete] == []
        assert fresh["replica2"] and all(o.complete for o in fresh["replica2"])
        after = [o for o in outcomes if marked_down < o.started and (o.ended or 0) < restarted]
        assert len(after) >= 20 and {o.replica for o in after} == {"replica2"}
        # Back: HAProxy sends to the new replica1 again, and its own log agrees with
        # HAProxy's X-Served-By (as does replica2's, over the whole run).
        assert [o for o in outcomes if o.started > back_up and o.replica == "replica1"]
        by = {
            name: sum(1 for o in outcomes if o.replica == name and o.complete) for name in REPLICAS
        }
        # The killed process's log lacks at most the lines of its last batch (written every
        # 0.1 s): the requests it finished in the 0.2 s before the SIGKILL.
        lost = [o for o in outcomes if o.replica == "replica1" and o.complete]
        lost = [o for o in lost if o.ended is not None and killed - 0.2 < o.ended <= killed]
        least = by["replica1"] - len(lost)
        wait_until(lambda: served(again) + served(victim) >= least, "replica1's log", 5)
        assert served(again) + served(victim) <= by["replica1"]
        wait_until(lambda: served(other) == by["replica2"], "replica2's log", 5)
        print(summary(outcomes, killed, marked_down, back_up))


def summary(outcomes: list[Outcome], killed: float, down: float, up: float) -> str:
    """Counts by kind and phase, for ``pytest -s``."""
    phases = {
        "before kill": (0, killed),
        "kill..down": (killed, down),
        "down..up": (down, up),
        "after up": (up, 1e18),
    }
    lines = [f"down {down - killed:.2f}s after the kill; replica1 up again {up - down:.2f}s later"]
    for phase, (start, end) in phases.items():
        for kind in ("stream", "plain"):
            group = [o for o in outcomes if o.kind == kind and start <= o.started < end]
            ok = sum(o.complete for o in group)
            lines.append(f"{phase:12} {kind:6} {ok:4} ok {len(group) - ok:3} broken")
    return "\n".join(lines)


def test_every_replica_sends_a_conversation_to_the_same_host(tmp_path: Path) -> None:
    with balancer(tmp_path) as lb:
        wait_until(lambda: set(lb.states().values()) == {"UP"}, "both replicas UP")
        # Each turn with the other replica's key: a conversation crosses replicas.
        keys = [APART["replica1"], APART["replica2"]] * 2
        turns = {
            f"conversation {i}": [
                ask(lb.port, "plain", f"conversation {i}", key=keys[i % 2 + turn])
                for turn in range(3)
            ]
            for i in range(6)
        }
    for conversation, answers in turns.items():
        assert all(a.complete for a in answers), answers
        assert len({a.host for a in answers}) == 1, (conversation, answers)
    replicas = {a.replica for answers in turns.values() for a in answers}
    homes = {answers[0].host for answers in turns.values()}
    crossed = [c for c, answers in turns.items() if len({a.replica for a in answers}) == 2]
    assert replicas == set(REPLICAS) and homes == {"gpu-a", "gpu-b"}
    assert len(crossed) == len(turns)


def test_with_no_replica_ready_the_live_ones_still_serve_their_healthy_routes(
    tmp_path: Path,
) -> None:
    # A route whose only host is off makes readyz 503 on every replica alike.
    dark = f"  gpu-x: http://127.0.0.1:{free_port()}\n"
    with balancer(tmp_path, dark, "  dark:\n    hosts: [gpu-x]\n") as lb:
        wait_until(lambda: set(lb.states().values()) == {"DOWN"}, "both replicas out of `crossbar`")
        wait_until(lambda: set(lb.states("crossbar-live").values()) == {"UP"}, "both replicas live")
        answers = [ask(lb.port, "plain", f"hi {i}", key=APART[REPLICAS[i % 2]]) for i in range(4)]
        assert all(a.complete for a in answers), answers
        assert {a.replica for a in answers} == set(REPLICAS)
        refused = http.client.HTTPConnection("127.0.0.1", lb.port, timeout=10)
        refused.request(
            "POST", "/dark/v1/chat/completions", "{}", {"Content-Type": "application/json"}
        )
        response = refused.getresponse()
        assert (response.status, json.loads(response.read())) == (
            503,
            api_error(
                503, "no healthy host for route dark: gpu-x down (health: connection refused)"
            ),
        )
        refused.close()


KEYS = {"alice": "alice", "bob": "x-api-key:bob"}
"""Two named keys, alice's sent as ``Authorization: Bearer``, bob's as ``x-api-key`` (as
OpenAI's and Anthropic's clients send them), that HAProxy's hash sends apart."""


def slot_shares(daemon: Daemon) -> set[str]:
    """The flows a replica's own metrics say used its slots (``crossbar_slot_share``),
    read with a route's key: with route keys and no status keys, the pages want one."""
    url = f"http://127.0.0.1:{daemon.port}/_crossbar/metrics"
    asked = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEYS['alice']}"})
    with urllib.request.urlopen(asked, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {
        line.split('flow="', 1)[1].split('"', 1)[0]
        for line in lines
        if line.startswith("crossbar_slot_share{")
    }


def test_each_key_is_served_by_one_replica_and_keys_spread_over_both(tmp_path: Path) -> None:
    keys = ", ".join(
        f'{{name: {name}, key: "{key.removeprefix("x-api-key:")}"}}' for name, key in KEYS.items()
    )
    open_route = "  open:\n    hosts: [gpu-a, gpu-b]\n    default_model: tiny-a\n"
    with balancer(tmp_path, extra_routes=f"    api_keys: [{keys}]\n{open_route}") as lb:
        wait_until(lambda: set(lb.states().values()) == {"UP"}, "both replicas UP")
        answers = {
            name: [ask(lb.port, "plain", f"{name} {i}", key=key) for i in range(8)]
            for name, key in KEYS.items()
        }
        answers["no key"] = [
            ask(lb.port, "plain", f"anyone {i}", path="/open/v1/chat/completions") for i in range(8)
        ]
        where = {name: {a.replica for a in got} for name, got in answers.items()}
        assert all(a.complete for got in answers.values() for a in got), answers
        # Every request of a key reached one replica; without a key, one per address.
        assert where["alice"] == {"replica1"} and where["bob"] == {"replica2"}
        assert len(where["no key"]) == 1
        # Each replica's own log and metrics agree: it served the requests HAProxy sent
        # it, and only its own key's flow used its slots there.
        for replica in REPLICAS:
            mine = sum(1 for got in answers.values() for a in got if a.replica == replica)
            daemon = lb.replicas[replica]
            wait_until(lambda d=daemon, n=mine: served(d) == n, f"{replica}'s log", 5)
        replica1, replica2 = (slot_shares(lb.replicas[r]) - {"127.0.0.1"} for r in REPLICAS)
        assert (replica1, replica2) == ({"alice"}, {"bob"})


def test_the_hash_sends_the_test_keys_apart(tmp_path: Path) -> None:
    """:data:`APART`, which the other tests count on, holds with this HAProxy."""
    with balancer(tmp_path) as lb:
        wait_until(lambda: set(lb.states().values()) == {"UP"}, "both replicas UP")
        for replica, key in APART.items():
            assert {ask(lb.port, "plain", "hi", key=key).replica for _ in range(3)} == {replica}

"""How long a ``cache_affinity`` turn should wait for its own host's slot: the measure
behind ``home_wait``'s default.

    .venv/bin/python benchmarks/home_wait.py [--draws 200000] [--seed 1]

A turn whose host (the one holding its conversation's prompt cache) has every slot busy
either waits for one of them to free, or moves at once to a host with a free slot and
prefills the whole conversation again there. Waiting costs the time until a slot of its
host frees (``t``); moving costs the prefill (``M``). With a bound ``w`` the turn pays
``t`` when ``t <= w`` and ``w + M`` otherwise. This draws ``t`` for a host whose slots run
answers back to back, each of a length uniform in ``[T/2, 3T/2]`` (as
``benchmarks/contention.py --spread 0.5``), seen at a random moment, and prints, per
setting, the expected cost of the turn for each bound and, in brackets, how much more
that is than the best bound's, in seconds.

The settings: ``S`` slots, answers of ``T`` seconds on average, a move's prefill ``M``:

- ``sim``: the simulator of ``benchmarks/contention.py`` (2 slots, 2 s answers), prefilling
  1,542 tokens in 55 ms as a tiny model does here (docs/design/queue.md);
- ``cpu-agent``: a real llama-server on this machine, whose 27,051-token agent prompt
  took 42.7 s to prefill, 2 slots, 20 s answers;
- ``gpu-agent``: a lab GPU: 4 slots, 20 s answers, the same prompt at about 3,000 tokens a
  second (9 s);
- ``gpu-short``: a lab GPU with short turns: 4 slots, 5 s answers, 6,000 tokens (2 s).

Pure arithmetic, no I/O: it takes a few seconds.
"""

from __future__ import annotations

import argparse
import random

SETTINGS = {
    "sim": (2, 2.0, 0.055),
    "gpu-short": (4, 5.0, 2.0),
    "gpu-agent": (4, 20.0, 9.0),
    "cpu-agent": (2, 20.0, 42.7),
}
BOUNDS = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 16.0)


def residual(rng: random.Random, mean: float) -> float:
    """Seconds until a slot that runs answers back to back frees, seen at a random
    moment: the answer under way is picked in proportion to its length (the moment more
    likely falls in a long one), and the moment is uniform within it."""
    while True:
        length = rng.uniform(mean / 2, mean * 3 / 2)
        if rng.random() < length / (mean * 3 / 2):  # length-biased
            return rng.uniform(0, length)


def cost(times: list[float], bound: float, move: float) -> float:
    """The turn's mean added latency with ``bound``: its wait, or the bound and the move."""
    return sum(t if t <= bound else bound + move for t in times) / len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    head = " | ".join(f"{b:g} s" for b in BOUNDS)
    print(f"| setting (S, T, M) | p50 / p95 to a free slot | {head} |")
    print("|---|--:|" + "--:|" * len(BOUNDS))
    for name, (slots, mean, move) in SETTINGS.items():
        times = sorted(min(residual(rng, mean) for _ in range(slots)) for _ in range(args.draws))
        p50, p95 = times[len(times) // 2], times[int(len(times) * 0.95)]
        costs = [cost(times, bound, move) for bound in BOUNDS]
        best = min(costs)
        cells = " | ".join(f"{c:.2f} (+{c - best:.2f})" for c in costs)
        print(f"| {name} ({slots}, {mean:g} s, {move:g} s) | {p50:.2f} / {p95:.2f} s | {cells} |")


if __name__ == "__main__":
    main()

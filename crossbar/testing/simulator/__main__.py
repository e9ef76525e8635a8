"""``python -m crossbar.testing.simulator``: simulated hosts to point a crossbar at by hand."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import crossbar.testing.simulator as package
from crossbar.testing.simulator.host import SimulatedHost


def _parse_models(spec: str) -> dict[str, str]:
    """``tiny-a=loaded,tiny-b`` -> {"tiny-a": "loaded", "tiny-b": "unloaded"}."""
    models = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, status = item.partition("=")
        models[name] = status or "unloaded"
    return models


def main(argv: Sequence[str] | None = None) -> None:
    """Run simulated hosts until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m crossbar.testing.simulator", description=package.__doc__
    )
    parser.add_argument("--listen", type=int, default=8081, help="port of the host (default 8081)")
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--models", default="tiny-a=loaded,tiny-b=unloaded", help="id=status,...")
    parser.add_argument(
        "--host", action="append", default=[], metavar="PORT:MODELS", help="another host"
    )
    parser.add_argument("--single", action="store_true", help="single-model llama-server")
    parser.add_argument(
        "--chunks", type=int, help="tokens of every answer (default: 8-60, by seed and prompt)"
    )
    parser.add_argument("--chunk-interval", type=float, default=0.05)
    parser.add_argument("--chunk-size", type=int, default=1)
    parser.add_argument("--load-time", type=float, default=2.0)
    parser.add_argument("--unload-time", type=float, default=0.1)
    parser.add_argument("--models-max", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4, help="slots of a model (-np, default 4)")
    parser.add_argument(
        "--ctx",
        type=int,
        help="tokens a slot holds (-c / -np); a longer prompt is refused (default: no limit)",
    )
    parser.add_argument(
        "--cache-ram", type=int, default=262_144, help="tokens of prompts kept in host memory"
    )
    parser.add_argument(
        "--prefill-time", type=float, default=0.0, help="seconds a prompt token not cached"
    )
    args = parser.parse_args(argv)
    specs = [(args.listen, args.models)]
    for extra in args.host:
        port, _, models = extra.partition(":")
        specs.append((int(port), models))

    from twisted.internet import reactor

    for port, spec in specs:
        host = SimulatedHost(
            _parse_models(spec),
            router=not args.single,
            chunks=args.chunks,
            chunk_interval=args.chunk_interval,
            chunk_size=args.chunk_size,
            load_time=args.load_time,
            unload_time=args.unload_time,
            models_max=args.models_max,
            slots=args.slots,
            cache_ram=args.cache_ram,
            prefill_time=args.prefill_time,
            ctx=args.ctx,
        )
        host.listen(port, args.interface)
        mode = "single-model" if args.single else "router"
        print(f"crossbar simulator ({mode}) listening on {host.url}: {spec}", flush=True)
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()

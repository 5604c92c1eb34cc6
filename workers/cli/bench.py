"""`bcw bench …`: the benchmarks that print figures (docs/benchmarks.md records them).
Each benchmark lives in `workers.bench`; this module only picks one and passes its
arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import sys

from workers.cli.common import EXIT_BAD_SETTINGS, Commands
from workers.settings import Settings


def add(commands: Commands) -> None:
    """Register this group's commands."""
    bench = commands.add_parser("bench", help="benchmarks that print figures")
    bench.add_argument(
        "bench",
        choices=[
            "runtime",
            "labeler",
            "sweep",
            "replay",
            "storm",
            "herd",
            "chaos",
            "soak",
            "hello",
            "ingest",
            "steady",
            "flush",
            "rest",
            "rollout",
        ],
        help="which benchmark",
    )
    bench.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="fleet size (100,000; soak: 300; hello: 12,000; flush: 1,000,000)",
    )
    bench.add_argument("--facts", type=int, default=50_000, help="facts to push through")
    bench.add_argument(
        "--gateways",
        type=int,
        default=None,
        help="gateways (storm, herd, ingest: 20; soak: 3; steady, flush: 200)",
    )
    bench.add_argument(
        "--processes", type=int, default=4, help="processes the gateways run in (storm)"
    )
    bench.add_argument(
        "--rounds", type=int, default=3, help="runs of each pipeline (medians shown)"
    )
    bench.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="how long faults (chaos), churn (soak) or the fleet (steady) go on (10; rest: 2)",
    )
    bench.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="minutes of the soak before its memory slope is measured (a third of it)",
    )
    bench.add_argument(
        "--max-slope",
        type=float,
        default=1.0,
        help="MiB per hour a soaked process may grow after its warm-up (1)",
    )
    bench.add_argument(
        "--heap",
        action="store_true",
        help="soak: trace each worker's allocations and print what grew after the warm-up "
        "(BCW_HEAP_SNAPSHOTS; tracing costs CPU and memory of its own)",
    )
    bench.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Hellos a second (chaos: 20 in all; herd: 200 per gateway)",
    )
    bench.add_argument(
        "--seed",
        type=int,
        default=1,
        help="the faults' random seed (chaos), the daemons' (rollout)",
    )
    bench.add_argument(
        "--silent-share",
        type=float,
        default=0.01,
        help="steady: the share of nodes whose flushes stop at minute 2 (0.01)",
    )
    bench.add_argument(
        "--starve",
        type=_fraction,
        default=1.0,
        help="steady: from minute 2, run the liveness processes only this fraction of each "
        "second (stopped and continued: a CPU starved), for --starve-for seconds (1: never)",
    )
    bench.add_argument(
        "--starve-for",
        type=float,
        default=150.0,
        help="steady: how long --starve lasts, in seconds (150)",
    )
    bench.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="steady: `bcw run liveness` processes (one per 500,000 nodes, at least one: "
        "each is one Python process, at most a core)",
    )
    bench.add_argument(
        "--parallel", type=int, default=1, help="rollout: gateways drained at a time (1)"
    )
    bench.add_argument(
        "--commands", type=int, default=1_000, help="rollout: commands kept in flight (1,000)"
    )
    bench.add_argument(
        "--minutes-after",
        type=float,
        default=0.0,
        help="rollout: minutes the fleet is held after the last gateway is back (0)",
    )
    bench.add_argument(
        "--stop-after",
        type=float,
        default=None,
        help="rollout: drain no wave more once the rollout has lasted this many minutes "
        "(the gateways not rolled by then are said so; default: roll every gateway)",
    )
    bench.add_argument(
        "--hold",
        type=float,
        default=60.0,
        help="rollout: seconds of steady state measured before the first drain (60)",
    )
    bench.add_argument(
        "--every", type=float, default=60.0, help="rollout: seconds between its lines (60)"
    )
    bench.add_argument(
        "--power-on",
        action="store_true",
        help="rollout: instead, --nodes daemons (10,000) powering on at once against "
        "--gateways (2) at 200 Hellos/s each, with the pushback honoured and without it",
    )
    bench.add_argument(
        "--sync-always",
        action="store_true",
        help="the embedded nats-server syncs each message to disk before its PubAck "
        "(sync_interval: always; runtime, herd)",
    )
    bench.add_argument(
        "--parts",
        action="store_true",
        help="runtime: also (a') without the message it publishes per fact, then without its "
        "inbox too, and what each part costs per fact",
    )
    bench.add_argument(
        "--embedded",
        action="store_true",
        help="start embedded servers for the run (else BCW_*_URL)",
    )
    bench.set_defaults(handler=_cmd_bench)


def _fraction(text: str) -> float:
    """A fraction in (0, 1], for argparse (its error names the option)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]")
    return value


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from workers import registry  # noqa: F401  (hands the runtime what each worker publishes)

    if importlib.util.find_spec("workers.bench") is None:
        print(
            "bcw bench: the benchmarks are a development tool, not part of this install "
            "(the wheel and the image leave them out): run them from a source checkout "
            "(make install, then .venv/bin/bcw bench …)",
            file=sys.stderr,
        )
        return EXIT_BAD_SETTINGS
    soak = args.bench == "soak"
    nodes = args.nodes if args.nodes is not None else 300 if soak else 100_000
    gateways = args.gateways if args.gateways is not None else 3 if soak else 20
    minutes = args.minutes if args.minutes is not None else 2.0 if args.bench == "rest" else 10.0
    if soak:
        from workers.bench import soak as soaking

        return asyncio.run(
            soaking.run(
                settings,
                minutes,
                nodes,
                gateways,
                args.embedded,
                args.max_slope,
                args.warmup,
                heap=args.heap,
            )
        )
    if args.bench == "runtime":
        from workers.bench import runtime

        return asyncio.run(
            runtime.run(
                settings, args.facts, args.embedded, args.rounds, args.sync_always, args.parts
            )
        )
    if args.bench == "ingest":
        from workers.bench import ingest

        return asyncio.run(ingest.run(settings, args.facts, gateways, args.embedded, args.rounds))
    if args.bench == "labeler":
        from workers.bench import reconnect

        return asyncio.run(reconnect.run_labeler(settings, nodes, args.embedded))
    if args.bench == "sweep":
        from workers.bench import sweep

        return asyncio.run(sweep.run(settings, nodes, args.embedded, args.rounds))
    if args.bench == "replay":
        from workers.bench import reconnect

        return asyncio.run(reconnect.run_replay(settings, nodes, args.embedded))
    if args.bench == "chaos":
        from workers.bench import chaos

        return asyncio.run(chaos.run(minutes, args.rate or 20.0, args.seed))
    if args.bench == "storm":
        from workers.bench import storm

        return asyncio.run(storm.run(settings, nodes, gateways, args.embedded, args.processes))
    if args.bench == "hello":
        from workers.bench import herd

        return asyncio.run(
            herd.run_hello(settings, args.nodes or 12_000, args.embedded, args.rounds)
        )
    if args.bench == "steady":
        from workers.bench.steady import run as steady

        return asyncio.run(
            steady.run(
                settings,
                nodes,
                args.gateways or 200,
                math.ceil(minutes),
                args.silent_share,
                args.replicas or max(1, math.ceil(nodes / 500_000)),
                args.embedded,
                args.starve,
                args.starve_for,
            )
        )
    if args.bench == "flush":
        from workers.bench.steady import flushcost

        return asyncio.run(
            flushcost.run(
                settings, args.nodes or 1_000_000, args.gateways or 200, args.rounds, args.embedded
            )
        )
    if args.bench == "rest":
        from workers.bench.steady import rest

        return asyncio.run(rest.run(settings, nodes, gateways, math.ceil(minutes), args.embedded))
    if args.bench == "rollout":
        return _rollout(args, settings)
    if args.bench == "herd":
        from workers.bench import herd

        return asyncio.run(
            herd.run(settings, nodes, gateways, args.rate or 200.0, args.embedded, args.sync_always)
        )
    return 2


def _rollout(args: argparse.Namespace, settings: Settings) -> int:
    from workers.bench.rollout import plan, poweron
    from workers.bench.rollout import run as rollout

    if args.power_on:
        return asyncio.run(
            poweron.run(settings, args.nodes or 10_000, args.gateways or 2, args.embedded)
        )
    nodes, gateways = args.nodes or 100_000, args.gateways or 25
    try:
        plan.waves(gateways, args.parallel)
    except ValueError as bad:
        print(f"bcw bench rollout: {bad}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if args.stop_after is not None and not args.stop_after > 0:
        print(
            f"bcw bench rollout: --stop-after must be > 0, got {args.stop_after:g}", file=sys.stderr
        )
        return EXIT_BAD_SETTINGS
    return asyncio.run(
        rollout.run(
            settings,
            nodes,
            gateways,
            args.parallel,
            args.commands,
            args.minutes_after,
            args.embedded,
            hold=args.hold,
            every=args.every,
            seed=args.seed,
            stop_after=args.stop_after,
        )
    )

"""Running workers: `bcw run` (one worker, all of them, or a relay), `bcw demo` (the
whole flow on embedded servers), `bcw sim` (a simulated fleet against running workers)
and `bcw heap diff` (what a running worker's heap snapshots say grew). SIGTERM and SIGINT stop them through `waiting.stop_on_signals`; `run_workers`
defers them from its first line (`waiting.defer_stop_signals`), so none is lost at start.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from workers.cli.common import EXIT_FAILED, Commands
from workers.runtime.effects.worker import Worker
from workers.settings import Settings

#: the simulator's scenarios (`workers.sim.scenarios.SCENARIOS`, not imported for a help page)
SCENARIO_NAMES = [
    "power-on",
    "gateway-loss",
    "clone",
    "journal-loss",
    "restart",
    "reconnect",
    "busy",
    "mixed",
]


def add(commands: Commands) -> None:
    """Register this group's commands."""
    run = commands.add_parser("run", help="run a worker (or `all` of them) in this process")
    run.add_argument(
        "worker", help="liveness, labeler, quarantine, replay, recorder; all of them; or relay"
    )
    run.set_defaults(handler=_cmd_run)

    sim = commands.add_parser("sim", help="simulate a fleet against the given NATS and PostgreSQL")
    sim.add_argument(
        "--scenario",
        default="mixed",
        choices=SCENARIO_NAMES,
    )
    sim.add_argument("--nodes", type=int, default=1000)
    sim.add_argument("--gateways", type=int, default=3)
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument(
        "--own-clock",
        action="store_true",
        help="this is a simulation database: move compute_now() to run minutes in seconds "
        "(refused while it holds sessions no simulator created); without it, real time",
    )
    sim.set_defaults(handler=_cmd_sim)

    heap = commands.add_parser("heap", help="what a process's heap holds (BCW_HEAP_SNAPSHOTS)")
    heap_commands = heap.add_subparsers(dest="action", required=True)
    diff = heap_commands.add_parser(
        "diff", help="the places holding more memory in a later snapshot than in an earlier one"
    )
    diff.add_argument("before", type=Path, help="the earlier snapshot (.tracemalloc)")
    diff.add_argument("after", type=Path, help="the later snapshot of the same process")
    diff.add_argument("--top", type=int, default=10, help="how many places (default 10)")
    diff.add_argument("--stacks", action="store_true", help="each place's whole stack too")
    diff.set_defaults(handler=_cmd_heap_diff)

    demo = commands.add_parser("demo", help="run the whole flow on embedded NATS and PostgreSQL")
    demo.add_argument("--directory", default=".bcw/demo", help="where the servers keep their data")
    demo.add_argument(
        "--keep",
        action="store_true",
        help="after the checks, keep the servers and the workers up until Ctrl-C "
        "(their URLs and pids are printed; the simulated fleet stops)",
    )
    demo.add_argument(
        "--scenario",
        default="mixed",
        choices=SCENARIO_NAMES,
        help="what the simulated fleet does (mixed: all of it, about 40 s; power-on: the "
        "fleet switched on, a few seconds)",
    )
    demo.add_argument("--nodes", type=int, default=1000, help="fleet size")
    demo.add_argument("--gateways", type=int, default=3, help="gateways")
    demo.add_argument(
        "--durable",
        action="store_true",
        help="servers that write to disk before they acknowledge (JetStream sync_interval: "
        "always, PostgreSQL fsync): slower, and what production should run",
    )
    demo.add_argument(
        "--otlp",
        metavar="URL",
        help="export traces to this OTLP endpoint (http://localhost:4318; "
        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc with :4317)",
    )
    demo.set_defaults(handler=_cmd_demo)


def run_workers(settings: Settings, workers: Sequence[Worker]) -> int:
    """Run `workers` in this process until SIGTERM/SIGINT; exit 0 after a clean drain.
    The last thing a process does: once it returns, a stop signal is only remembered."""
    from workers.runtime.base import heap
    from workers.runtime.base.waiting import defer_stop_signals, stop_on_signals
    from workers.runtime.observability import logs
    from workers.runtime.process import run_process

    defer_stop_signals()  # a stop asked for while this process starts is not lost
    logs.configure(settings.log_format, settings.log_level)
    heap.settle()  # everything it runs is imported and built: the collector leaves it be
    if settings.heap_snapshots:
        heap.snapshots(Path(settings.heap_snapshots), settings.heap_snapshot_every)

    async def main() -> None:
        stopping = asyncio.Event()
        stop_on_signals(stopping)
        await run_process(settings, workers, stopping=stopping)

    asyncio.run(main())
    defer_stop_signals()  # the loop closed gave them back to the default: a second one
    return 0  # now, as the interpreter exits, would end a drained process with -15


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from workers.registry import WORKERS

    if args.worker == "relay":  # an outbox relay and nothing else
        return run_workers(settings, [])
    names = sorted(WORKERS) if args.worker == "all" else [args.worker]
    unknown = [name for name in names if name not in WORKERS]
    if unknown or not names:
        print(
            f"bcw run: unknown worker {args.worker!r}; known: {', '.join(sorted(WORKERS)) or 'none'}",
            file=sys.stderr,
        )
        return 2
    return run_workers(settings, [WORKERS[name](settings) for name in names])


def _cmd_heap_diff(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime.base import heap

    try:
        total, places = heap.growth(args.before, args.after, args.top)
    except (OSError, ValueError) as error:  # a missing, truncated or foreign file
        print(f"bcw heap diff: cannot read the snapshots: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"traced memory {total / 1024:+,.1f} KiB from {args.before.name} to {args.after.name}")
    for place in places:
        print(
            f"{place.size_diff / 1024:+10,.1f} KiB {place.count_diff:+8,d} blocks "
            f"({place.size / 1024:,.1f} KiB held)  {place.where}"
        )
        if args.stacks:
            print("".join(f"      {frame}\n" for frame in place.stack), end="")
    return 0


def _cmd_sim(args: argparse.Namespace, settings: Settings) -> int:
    from workers import registry  # noqa: F401  (hands the runtime what each worker publishes)
    from workers.sim.run import run_scenario

    return asyncio.run(
        run_scenario(settings, args.scenario, args.nodes, args.gateways, args.seed, args.own_clock)
    )


def _cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from workers.demo import run as demo

    return asyncio.run(
        demo.main(
            Path(args.directory).resolve(),
            hold=args.keep,
            nodes=args.nodes,
            gateways=args.gateways,
            otlp=args.otlp,
            durable=args.durable,
            scenario=args.scenario,
        )
    )

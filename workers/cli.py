"""`bcw`: the one entry point of bc-workers (migrate, provision, run, demo, bench, …).

Parses arguments, reads settings, and hands over to the module that does the work. The
only place that installs signal handlers or calls `sys.exit`, and the one place that
turns errors into what an operator reads: one line naming the setting, and an exit code
(0 done; 1 failed, e.g. a server out of reach; 2 a bad setting or usage; 3 credentials
or permissions refused). A traceback only with `BCW_LOG_LEVEL=DEBUG`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from pydantic import ValidationError

from workers.runtime.base.errors import SettingError
from workers.runtime.base.settings import Settings, describe
from workers.runtime.effects.worker import Worker

EXIT_FAILED = 1
EXIT_BAD_SETTINGS = 2
EXIT_REFUSED = 3


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime.store import db, migrate, roles

    if args.print_grants:  # no connection: for a DBA who runs it by hand
        print(roles.create_roles_sql() + roles.grants_sql(), end="")
        return 0

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            if args.status:
                rows = await migrate.status(conn)
                for row in rows:
                    print(f"{row.state:<8} {row.name}  {row.applied_at or ''}".rstrip())
                return 1 if any(row.state == "changed" for row in rows) else 0
            applied = await migrate.migrate(conn)
            print(
                f"applied {len(applied)} migration(s)"
                + (": " + ", ".join(applied) if applied else "")
            )
            granted = await migrate.grant(conn)
            print(
                "granted to " + ", ".join(granted)
                if granted
                else "no bcw_* role exists and this role may not create roles: no grants"
            )
            return 0
        finally:
            await conn.close()

    try:
        return asyncio.run(run())
    except migrate.MigrationError as error:
        print(f"bcw migrate: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS


def run_workers(settings: Settings, workers: Sequence[Worker]) -> int:
    """Run `workers` in this process until SIGTERM/SIGINT; exit 0 after a clean drain."""
    from workers.runtime.observability import logs
    from workers.runtime.process import run_process

    logs.configure(settings.log_format, settings.log_level)

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await run_process(settings, workers, stopping=stopping)

    asyncio.run(main())
    return 0


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


def _cmd_provision(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers.registry import WORKERS
    from workers.runtime.bus import connection, streams

    async def run() -> int:
        subjects = Subjects(settings.subject_root)
        nc = await connection.connect(settings.nats, name="bcw provision")
        try:
            js = nc.jetstream()
            for stream, state in (
                await streams.provision_streams(js, subjects, settings.nats.stream_replicas)
            ).items():
                print(f"stream   {stream:<24} {state}")
            for name, build in sorted(WORKERS.items()):
                spec = build(settings).consumer_spec(subjects)
                await streams.ensure_consumer(js, subjects.facts_stream, spec, settings.consumer)
                print(f"consumer {name:<24} ensured ({', '.join(spec.filter_subjects)})")
            return 0
        finally:
            await nc.close()

    try:
        return asyncio.run(run())
    except streams.ProvisionError as error:
        print(f"bcw provision: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS


def _cmd_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers.runtime.bus import connection, deadletter

    async def run() -> int:
        subjects = Subjects(settings.subject_root)
        nc = await connection.connect(settings.nats, name="bcw dead-letters")
        try:
            js = nc.jetstream()
            letters = await deadletter.list_dead_letters(js, subjects, args.worker, args.limit)
            if args.seq:
                letters = [letter for letter in letters if letter.seq in set(args.seq)]
            if args.action == "list":
                for letter in letters:
                    when = letter.time.isoformat(timespec="seconds") if letter.time else "-"
                    print(
                        f"{letter.seq:>8} {when} {letter.worker:<12} {letter.cause:<15} {letter.subject}  {letter.reason}"
                    )
                print(f"{len(letters)} dead letter(s)")
                return 0
            refused = 0
            for letter in letters:
                try:
                    await deadletter.redrive(js, subjects, letter)
                except deadletter.RedriveError as error:
                    print(f"not re-driven: {error}", file=sys.stderr)
                    refused += 1
                    continue
                print(f"re-drove {letter.seq} to {letter.subject}")
            print(f"{len(letters) - refused} re-driven")
            return EXIT_FAILED if refused else 0
        finally:
            await nc.close()

    return asyncio.run(run())


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    if args.bench == "runtime":
        from workers.bench import runtime

        return asyncio.run(runtime.run(settings, args.facts, args.embedded, args.rounds))
    if args.bench == "labeler":
        from workers.bench import labeler

        return asyncio.run(labeler.run(settings, args.nodes, args.embedded))
    if args.bench == "sweep":
        from workers.bench import sweep

        return asyncio.run(sweep.run(settings, args.nodes, args.embedded, args.rounds))
    if args.bench == "replay":
        from workers.bench import replay

        return asyncio.run(replay.run(settings, args.nodes, args.embedded))
    if args.bench == "chaos":
        from workers.bench import chaos

        return asyncio.run(chaos.run(args.minutes, args.rate or 20.0, args.seed))
    if args.bench == "storm":
        from workers.bench import storm

        return asyncio.run(
            storm.run(settings, args.nodes, args.gateways, args.embedded, args.processes)
        )
    if args.bench == "herd":
        from workers.bench import herd

        return asyncio.run(
            herd.run(settings, args.nodes, args.gateways, args.rate or 200.0, args.embedded)
        )
    return 2


def _cmd_commands(args: argparse.Namespace, settings: Settings) -> int:
    from workers.replay.commands import list_commands
    from workers.runtime.store import db

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            rows = await list_commands(conn, args.node, args.limit)
        finally:
            await conn.close()
        print(
            f"{'seq':>5} {'state':<10} {'epoch':>5} {'tries':>5} {'busy':>4} {'lane':<10} {'kind':<20} command_id / reason"
        )
        for r in rows:
            epoch = "-" if r["session_epoch"] is None else r["session_epoch"]
            extra = r["failure_reason"] or (
                f"not before {r['not_before']:%H:%M:%S}" if r["not_before"] else ""
            )
            print(
                f"{r['seq']:>5} {r['state']:<10} {epoch:>5} {r['delivery_attempt']:>5} {r['busy_attempts']:>4} "
                f"{r['lane']:<10} {r['kind']:<20} {r['command_id']} {extra}".rstrip()
            )
        if not rows:
            print(f"no commands for node {args.node!r}")
        return 0

    return asyncio.run(run())


def _cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    from workers import explain
    from workers.runtime.store import db

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            row = await explain.session(conn, args.node)
            steps = await explain.timeline(conn, args.node, args.since)
        finally:
            await conn.close()
        if args.json:
            print(explain.as_json(args.node, row, steps))
        else:
            explain.render(args.node, row, steps, str(args.since))
        return 0 if row is not None else 1

    return asyncio.run(run())


def _since(text: str) -> timedelta:
    from workers.explain import parse_since

    try:
        return parse_since(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cmd_liveness_release(args: argparse.Namespace, settings: Settings) -> int:
    import getpass
    import socket

    from workers.liveness.breaker import release
    from workers.runtime.store import db

    who = args.by or f"{getpass.getuser()}@{socket.gethostname()}"

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            released = await release(conn, args.gateway, who)
        finally:
            await conn.close()
        if released is None:
            print(
                f"bcw liveness release: no open breaker for gateway {args.gateway!r}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        print(
            f"breaker of gateway {args.gateway} released by {who} at {released:%Y-%m-%d %H:%M:%S%z}; "
            "the next sweep disconnects its stale sessions"
        )
        return 0

    return asyncio.run(run())


def _cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    from workers import tail

    try:
        return asyncio.run(
            tail.follow(
                settings, event_type=args.type, node=args.node, since=args.since, everything=args.all,
                as_json=args.json, count=args.count, idle_exit=args.idle_exit,
            )
        )  # fmt: skip
    except KeyboardInterrupt:
        return 0


def _cmd_sim(args: argparse.Namespace, settings: Settings) -> int:
    from workers.sim.run import run_scenario

    return asyncio.run(run_scenario(settings, args.scenario, args.nodes, args.gateways, args.seed))


def _cmd_schemas_export(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.export import export

    for path in export(Path(args.directory)):
        print(path)
    return 0


def _cmd_auth_nats(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers.runtime.bus import principals

    gateways = [g.strip() for g in args.gateways.split(",") if g.strip()] if args.gateways else []
    try:
        written = principals.write(
            Path(args.out), Subjects(settings.subject_root), principals.check_gateways(gateways)
        )
    except ValueError as error:
        print(f"bcw auth nats: --gateways: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except OSError as error:
        print(f"bcw auth nats: --out {args.out}: {error.strerror or error}", file=sys.stderr)
        return EXIT_FAILED
    for path in written:
        print(path)
    return 0


def _cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from workers import demo

    return asyncio.run(
        demo.main(
            Path(args.directory).resolve(),
            hold=args.keep,
            nodes=args.nodes,
            gateways=args.gateways,
            otlp=args.otlp,
        )
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcw", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", help="apply the database migrations")
    migrate.add_argument(
        "--status", action="store_true", help="list applied and pending migrations"
    )
    migrate.add_argument(
        "--print-grants",
        action="store_true",
        help="print the SQL that creates the bcw_* roles and grants them least privilege",
    )
    migrate.set_defaults(handler=_cmd_migrate)

    schemas = commands.add_parser("schemas", help="the bus contract's JSON Schemas")
    schemas_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schemas_commands.add_parser("export", help="write every message's JSON Schema to DIR")
    export.add_argument("directory")
    export.set_defaults(handler=_cmd_schemas_export)

    run = commands.add_parser("run", help="run a worker (or `all` of them) in this process")
    run.add_argument(
        "worker", help="liveness, labeler, quarantine, replay, recorder; all of them; or relay"
    )
    run.set_defaults(handler=_cmd_run)

    provision = commands.add_parser("provision", help="create or update the streams and consumers")
    provision.set_defaults(handler=_cmd_provision)

    dead = commands.add_parser("dead-letters", help="list or re-drive dead-lettered messages")
    dead.add_argument("action", choices=["list", "redrive"])
    dead.add_argument("--worker", help="only this worker's dead letters")
    dead.add_argument(
        "--seq", type=int, action="append", help="only this dead-letter sequence (repeatable)"
    )
    dead.add_argument("--limit", type=int, default=1000, help="at most this many")
    dead.set_defaults(handler=_cmd_dead_letters)

    bench = commands.add_parser("bench", help="benchmarks that print figures")
    bench.add_argument(
        "bench",
        choices=["runtime", "labeler", "sweep", "replay", "storm", "herd", "chaos"],
        help="which benchmark",
    )
    bench.add_argument("--nodes", type=int, default=100_000, help="fleet size (labeler, sweep, …)")
    bench.add_argument("--facts", type=int, default=50_000, help="facts to push through")
    bench.add_argument("--gateways", type=int, default=20, help="gateways (storm, herd)")
    bench.add_argument(
        "--processes", type=int, default=4, help="processes the gateways run in (storm)"
    )
    bench.add_argument(
        "--rounds", type=int, default=3, help="runs of each pipeline (medians shown)"
    )
    bench.add_argument("--minutes", type=float, default=10.0, help="how long faults go on (chaos)")
    bench.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Hellos a second (chaos: 20 in all; herd: 200 per gateway)",
    )
    bench.add_argument("--seed", type=int, default=1, help="the faults' random seed (chaos)")
    bench.add_argument(
        "--embedded",
        action="store_true",
        help="start embedded servers for the run (else BCW_*_URL)",
    )
    bench.set_defaults(handler=_cmd_bench)

    listing = commands.add_parser("commands", help="a node's commands: state, epoch, attempts")
    listing.add_argument("node")
    listing.add_argument("--limit", type=int, default=100, help="the latest this many")
    listing.set_defaults(handler=_cmd_commands)

    why = commands.add_parser(
        "explain", help="why a node is where it is: its session and its timeline, with trace ids"
    )
    why.add_argument("node")
    why.add_argument(
        "--since", type=_since, default="24h", help="how far back (30m, 1h, 2d; default 24h)"
    )
    why.add_argument("--json", action="store_true", help="print JSON instead of a table")
    why.set_defaults(handler=_cmd_explain)

    live = commands.add_parser("liveness", help="the liveness controller's fleet breaker")
    live_commands = live.add_subparsers(dest="liveness_command", required=True)
    release = live_commands.add_parser(
        "release", help="let the next sweep disconnect the stale sessions an open breaker holds"
    )
    release.add_argument("--gateway", required=True, help="the gateway whose breaker is open")
    release.add_argument("--by", help="who releases it (for the log); default user@host")
    release.set_defaults(handler=_cmd_liveness_release)

    events = commands.add_parser("events", help="follow the session events workers publish")
    events.add_argument(
        "--type", default=">", help="event type, NATS wildcards allowed: node.*, command.>"
    )
    events.add_argument("--node", help="only this node's events")
    events.add_argument("--since", help="from this long ago (10m, 2h, 1d) or this ISO 8601 time")
    events.add_argument("--all", action="store_true", help="from the start of the stream")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.add_argument("--count", type=int, help="exit after this many events")
    events.add_argument("--idle-exit", type=float, help="exit after this many quiet seconds")
    events.set_defaults(handler=_cmd_events)

    sim = commands.add_parser("sim", help="simulate a fleet against the given NATS and PostgreSQL")
    sim.add_argument(
        "--scenario",
        default="mixed",
        choices=["power-on", "gateway-loss", "clone", "journal-loss", "busy", "mixed"],
    )
    sim.add_argument("--nodes", type=int, default=1000)
    sim.add_argument("--gateways", type=int, default=3)
    sim.add_argument("--seed", type=int, default=1)
    sim.set_defaults(handler=_cmd_sim)

    auth = commands.add_parser("auth", help="credentials of the bus principals")
    auth_commands = auth.add_subparsers(dest="auth_command", required=True)
    auth_nats = auth_commands.add_parser(
        "nats",
        help="write DIR/auth.conf (nkey users and permissions) and DIR/<principal>.nk seeds",
    )
    auth_nats.add_argument("--gateways", default="", help="gateway ids, comma-separated")
    auth_nats.add_argument("--out", required=True, help="the directory to write to")
    auth_nats.set_defaults(handler=_cmd_auth_nats)

    demo = commands.add_parser("demo", help="run the whole flow on embedded NATS and PostgreSQL")
    demo.add_argument("--directory", default=".bcw/demo", help="where the servers keep their data")
    demo.add_argument("--keep", action="store_true", help="keep the servers up until Ctrl-C")
    demo.add_argument("--nodes", type=int, default=1000, help="fleet size")
    demo.add_argument("--gateways", type=int, default=3, help="gateways")
    demo.add_argument(
        "--otlp",
        metavar="URL",
        help="export traces to this OTLP endpoint (http://localhost:4318; "
        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc with :4317)",
    )
    demo.set_defaults(handler=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as error:
        for line in describe(error):
            print(f"bcw: {line}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        code: int = args.handler(args, settings)
    except SettingError as error:
        _explain(args.command, str(error))
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # a bug, or a failure nothing above names: still one line
        _explain(args.command, f"{type(error).__name__}: {error}")
        return EXIT_FAILED
    return code


def _explain(command: str, line: str) -> None:
    if os.environ.get("BCW_LOG_LEVEL", "").upper() == "DEBUG":
        traceback.print_exc()
    print(f"bcw {command}: {line}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

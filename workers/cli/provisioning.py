"""Setting a system up: `bcw migrate`, `bcw provision`, `bcw schemas export` — the
database schema and roles, the streams and consumers, the contract's JSON Schemas (the
credentials: `authorizing`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from workers.cli.common import (
    EXIT_BAD_SETTINGS,
    EXIT_FAILED,
    Commands,
    json_line,
    positive_duration,
)
from workers.runtime.base.release import release
from workers.settings import Settings

if TYPE_CHECKING:
    from nats.js.api import ConsumerConfig

    from workers.runtime.store.migrate import MigrationStatus


def add(commands: Commands) -> None:
    """Register this group's commands."""
    migrate = commands.add_parser("migrate", help="apply the database migrations")
    migrate.add_argument(
        "--status", action="store_true", help="list applied and pending migrations"
    )
    migrate.add_argument(
        "--json", action="store_true", help="--status: one JSON object per migration"
    )
    migrate.add_argument(
        "--wait",
        metavar="DURATION",
        type=positive_duration,
        help="apply nothing: wait until every migration of this release is applied (by the "
        "migration Job), then exit 0; exit 1 after DURATION (a worker pod's init container)",
    )
    migrate.add_argument(
        "--print-grants",
        action="store_true",
        help="print the SQL that creates the bcw_* roles and grants them least privilege",
    )
    migrate.add_argument(
        "--legacy-gateway-role",
        action="store_true",
        help="also create and grant bcw_gateway, for gateways older than 0.4 (direct writes: "
        "its logins may rebind sessions and move any gateway's lease); without it, an "
        "existing bcw_gateway keeps no grant",
    )
    migrate.set_defaults(handler=_cmd_migrate)

    schemas = commands.add_parser("schemas", help="the bus contract's JSON Schemas")
    schemas_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schemas_commands.add_parser(
        "export",
        help="write every message's JSON Schema to DIR, and/or the bus's AsyncAPI 3 document",
    )
    export.add_argument("directory", nargs="?", help="where to write the JSON Schemas")
    export.add_argument(
        "--asyncapi", metavar="FILE", help="write the AsyncAPI 3 document of the bus to FILE"
    )
    export.set_defaults(handler=_cmd_schemas_export)

    provision = commands.add_parser("provision", help="create or update the streams and consumers")
    provision.add_argument(
        "--check",
        action="store_true",
        help="change nothing: say whether each stream exists as the settings describe it "
        "(exit 1 when one is missing)",
    )
    provision.add_argument(
        "--json", action="store_true", help="--check: one JSON object per stream"
    )
    provision.set_defaults(handler=_cmd_provision)


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from workers.registry import ROLES
    from workers.runtime.store import db, migrate, policies

    if args.print_grants:  # no connection: for a DBA who runs it by hand
        from workers.runtime.store.limits import limits_sql

        groups = ROLES.groups_for(args.legacy_gateway_role)
        rules = "".join(policies.policies_sql(ROLES, groups).values())
        logins = "".join(
            limits_sql(group, limits) + "\n"
            for group, limits in ROLES.LIMITS.items()
            if group in groups
        )
        print(ROLES.create_roles_sql(groups) + ROLES.grants_sql(groups) + rules + logins, end="")
        return 0

    if args.json and not args.status:
        print("bcw migrate: --json goes with --status", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if args.wait is not None:
        return asyncio.run(_wait_for_schema(settings, args.wait))

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            if args.status:
                rows = await migrate.status(conn)
                for row in rows:
                    if args.json:
                        json_line(
                            name=row.name,
                            state=row.state,
                            applied_at=row.applied_at,
                            release=row.release,
                            refused=row.refused,
                        )
                        continue
                    by = f"  (release {row.release})" if row.state.startswith("newer") else ""
                    print(f"{row.state:<8} {row.name}  {row.applied_at or ''}{by}".rstrip())
                return 1 if any(row.refused for row in rows) else 0
            async with migrate.schema_lock(lambda: db.connect(settings.database)):
                applied = await migrate.migrate(conn)
                print(
                    f"applied {len(applied)} migration(s)"
                    + (": " + ", ".join(applied) if applied else "")
                )
                _say_newer(await migrate.status(conn))
                granted = await migrate.grant(conn, ROLES, args.legacy_gateway_role)
                print(
                    "granted to " + ", ".join(granted)
                    if granted
                    else "no bcw_* role exists and this role may not create roles: no grants"
                )
                refused = bool(granted.limits.refused)
                print(granted.limits.say(), file=sys.stderr if refused else sys.stdout)
                if settings.hello_proof is not None:
                    await migrate.set_hello_proof(conn, settings.hello_proof)
            policy = await migrate.hello_proof(conn)
            print(f"Hello proofs: {policy}")
            if policy != "require":  # loudly: one line, and the metric and alert say it on
                unproven = await migrate.unproven_sessions(conn)
                print(f"WARNING: {migrate.proof_warning(policy, unproven)}", file=sys.stderr)
            return 0
        finally:
            await conn.close()

    try:
        return asyncio.run(run())
    except migrate.MigrationError as error:
        print(f"bcw migrate: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except migrate.LockBusy as error:
        print(f"bcw migrate: {error}", file=sys.stderr)
        return EXIT_FAILED


async def _wait_for_schema(settings: Settings, patience: float) -> int:
    """Until the database holds every migration on disk: exit 0; 2 when one differs (the
    database is ahead or was changed); 1 after `patience` seconds. A database out of reach,
    refusing, hanging, starting up or full, a ledger not there yet or not yet readable by
    this login all mean: not yet. A setting that can never work (TLS that does not verify,
    credentials refused) raises at once (`db.named`). No try outlasts the bound by 2 s."""
    import asyncpg

    from workers.runtime.store import db, migrate

    deadline = time.monotonic() + patience
    waiting = "the database"
    while True:
        try:
            # to the bound; a try begun just before it still has 2 s (a loaded node)
            async with asyncio.timeout(max(2.0, deadline - time.monotonic())):
                conn = await db.connect(settings.database)
                try:
                    rows = await migrate.status(conn)
                finally:
                    await conn.close()
        except (db.UnreachableError, TimeoutError) as error:  # TimeoutError: the bound came
            waiting = f"the database: {str(error) or f'{db.URL_SETTING}: no answer'}"
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            waiting = f"the database ({type(error).__name__})"
        else:
            why = migrate.refusal(rows, release())
            if why is not None:
                print(f"bcw migrate --wait: {why}", file=sys.stderr)
                return EXIT_BAD_SETTINGS
            pending = [row.name for row in rows if row.state == "pending"]
            if not pending:
                print(
                    f"schema current: {sum(row.state == 'applied' for row in rows)} migrations applied"
                )
                _say_newer(rows)
                return 0
            waiting = f"{len(pending)} pending migration(s): {', '.join(pending[:3])}"
        if time.monotonic() >= deadline:
            database = waiting.startswith("the database")
            hint = "" if database else ": has `bcw migrate` run (the chart's migration Job)?"
            print(
                f"bcw migrate --wait: still waiting for {waiting} after {patience:g} s{hint}",
                file=sys.stderr,
            )
            return 1
        await asyncio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


def _say_newer(rows: list[MigrationStatus]) -> None:
    """Say which migrations a newer release of this major applied (a rollback runs on them)."""
    newer = [row for row in rows if row.state == "newer"]
    if newer:
        releases = ", ".join(sorted({row.release or "?" for row in newer}))
        print(
            f"the schema also holds {len(newer)} migration(s) of release {releases}, newer "
            f"within this major: release {release()} runs on it (migrations only expand)"
        )


def subscriber_config(app: str) -> ConsumerConfig:
    """The durable of the subscriber application `app`: a pull consumer of every event the
    stream holds (no deliver subject), which only `subscriber-<app>` pulls from."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from workers.runtime.bus.principals import subscriber_durable

    durable = subscriber_durable(app)
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30.0,
        max_ack_pending=1000,
        max_waiting=64,
    )


def _cmd_provision(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers.gateway import notices
    from workers.registry import WORKERS
    from workers.runtime.bus import connection, server, streams

    if args.json and not args.check:
        print("bcw provision: --json goes with --check", file=sys.stderr)
        return EXIT_BAD_SETTINGS

    async def run() -> int:
        subjects = Subjects(settings.subject_root)
        nc = await connection.connect(settings.nats, name="bcw provision")
        try:
            js = nc.jetstream()
            version = server.server_version(nc)
            limits = streams.limits_of(settings.nats, version)
            if not limits.batched:
                print(
                    f"nats-server {version} has no fast batches (2.14+): the "
                    "streams are made without them, the relay publishes one message at a time",
                    file=sys.stderr if args.json else sys.stdout,
                )
            if args.check:
                checked = await streams.check_streams(
                    js, subjects, settings.nats.stream_replicas, limits
                )
                for stream, state in checked.items():
                    if args.json:
                        json_line(stream=stream, state=state)
                    else:
                        print(f"stream   {stream:<24} {state}")
                return EXIT_FAILED if "missing" in checked.values() else 0
            for stream, state in (
                await streams.provision_streams(js, subjects, settings.nats.stream_replicas, limits)
            ).items():
                print(f"stream   {stream:<24} {state}")
            for name, build in sorted(WORKERS.items()):
                spec = build(settings).consumer_spec(subjects)
                await streams.ensure_consumer(js, subjects.facts_stream, spec, settings.consumer)
                print(f"consumer {name:<24} ensured ({', '.join(spec.filter_subjects)})")
            # the consumers of the principals that may make none (a create names any
            # deliver subject): each gateway's notices, each subscriber application's events
            for gateway in settings.nats.notices_gateways:
                await notices.provision(js, subjects, gateway)
                print(f"consumer gw-{gateway:<21} ensured ({subjects.gateway_notices(gateway)})")
            for app in settings.nats.subscriber_apps:
                await js.add_consumer(subjects.events_stream, subscriber_config(app))
                print(f"consumer sub-{app:<20} ensured ({subjects.events_stream})")
            return 0
        finally:
            await nc.close()

    try:
        return asyncio.run(run())
    except streams.ProvisionError as error:
        print(f"bcw provision: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS


def _cmd_schemas_export(args: argparse.Namespace, settings: Settings) -> int:
    from schemas import asyncapi
    from schemas.export import export

    if not args.directory and not args.asyncapi:
        print("bcw schemas export: give DIR, --asyncapi FILE, or both", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if args.directory:
        for path in export(Path(args.directory)):
            print(path)
    if args.asyncapi:
        print(asyncapi.write(Path(args.asyncapi)))
    return 0

"""The bus principals' and gateway logins' credentials: `bcw auth nats` (nkeys and their
permissions) and `bcw auth db` (each gateway login bound to its one gateway id).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from workers.cli.common import (
    EXIT_BAD_SETTINGS,
    EXIT_FAILED,
    EXIT_REFUSED,
    Commands,
    json_line,
)
from workers.settings import Settings


def add(commands: Commands) -> None:
    """Register this group's commands."""
    auth = commands.add_parser("auth", help="credentials of the bus principals")
    auth_commands = auth.add_subparsers(dest="auth_command", required=True)
    auth_nats = auth_commands.add_parser(
        "nats",
        help="write DIR/auth.conf (nkey users and permissions), DIR/jetstream.conf "
        "(sync_interval: always) and DIR/<principal>.nk seeds",
    )
    auth_nats.add_argument("--gateways", default="", help="gateway ids, comma-separated")
    auth_nats.add_argument(
        "--subscribers",
        default="",
        help="subscriber applications, comma-separated: each gets its own principal "
        "`subscriber-<app>`, the only one that may pull from its durable `sub-<app>`",
    )
    auth_nats.add_argument("--out", required=True, help="the directory to write to")
    auth_nats.set_defaults(handler=_cmd_auth_nats)
    auth_db = auth_commands.add_parser(
        "db",
        help="bind gateway logins to their gateway ids (a login acts as its gateway only), "
        "then list the bindings; as the schema's owner",
    )
    auth_db.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="LOGIN=GATEWAY",
        help="let the database role LOGIN (IN ROLE bcw_gateway_bound) act as GATEWAY",
    )
    auth_db.add_argument(
        "--unbind", action="append", default=[], metavar="LOGIN", help="LOGIN acts as no gateway"
    )
    auth_db.set_defaults(handler=_cmd_auth_db)
    auth_db.add_argument("--json", action="store_true", help="one JSON object per binding")


def _cmd_auth_nats(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers import registry  # noqa: F401  (hands the runtime what each worker publishes)
    from workers.runtime.bus import principals, server

    gateways = [g.strip() for g in args.gateways.split(",") if g.strip()]
    apps = [a.strip() for a in args.subscribers.split(",") if a.strip()]
    try:
        apps = principals.check_subscribers(apps)
    except ValueError as error:
        print(f"bcw auth nats: --subscribers: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        written = principals.write(
            Path(args.out),
            Subjects(settings.subject_root),
            principals.check_gateways(gateways),
            apps,
        )
        written.insert(1, server.write_jetstream_fragment(Path(args.out)))
    except principals.SeedFileError as error:
        print(f"bcw auth nats: --out: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except ValueError as error:
        print(f"bcw auth nats: --gateways: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except OSError as error:
        print(f"bcw auth nats: --out {args.out}: {error.strerror or error}", file=sys.stderr)
        return EXIT_FAILED
    for path in written:
        print(path)
    return 0


def _cmd_auth_db(args: argparse.Namespace, settings: Settings) -> int:
    from workers.gateway import store
    from workers.runtime.bus import principals
    from workers.runtime.store import db

    pairs = []
    for given in args.bind:
        login, _, gateway = given.partition("=")
        try:
            if not login or not gateway:
                raise ValueError(f"{given!r} is not LOGIN=GATEWAY")
            principals.check_gateways([gateway])
        except ValueError as error:
            print(f"bcw auth db: --bind: {error}", file=sys.stderr)
            return EXIT_BAD_SETTINGS
        pairs.append((login, gateway))

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            async with conn.transaction():  # all of them or none
                for login, gateway in pairs:
                    await store.bind(conn, login, gateway)
                for login in args.unbind:
                    if not await store.unbind(conn, login):
                        print(
                            f"bcw auth db: --unbind {login}: was bound to no gateway",
                            file=sys.stderr if args.json else sys.stdout,
                        )
            rows = await store.bindings(conn)
        finally:
            await conn.close()
        if args.json:
            for row in rows:
                json_line(
                    login=row.login,
                    gateway_id=row.gateway_id,
                    bound_at=row.bound_at,
                    in_group=row.in_group,
                )
            return 0
        for row in rows:
            warning = "" if row.in_group else "  (not IN ROLE bcw_gateway_bound: cannot act)"
            print(f"{row.login:<24} acts as {row.gateway_id}{warning}")
        if not rows:
            print("no login is bound to a gateway")
        return 0

    try:
        return asyncio.run(run())
    except store.BindingError as error:
        print(f"bcw auth db: --bind: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except store.LimitsRefused as error:
        print(f"bcw auth db: --bind: {error}", file=sys.stderr)
        return EXIT_REFUSED

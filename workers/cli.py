"""`bcw`: the one entry point of bc-workers (migrate, provision, run, demo, bench, …).

Parses arguments, reads settings, and hands over to the module that does the work. The
only place that installs signal handlers or calls `sys.exit`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from workers.runtime.settings import Settings


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime import db, migrate

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
            return 0
        finally:
            await conn.close()

    try:
        return asyncio.run(run())
    except migrate.MigrationError as error:
        print(f"bcw migrate: {error}", file=sys.stderr)
        return 2


def _cmd_schemas_export(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.export import export

    for path in export(Path(args.directory)):
        print(path)
    return 0


def _cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from workers import demo

    return asyncio.run(demo.main(Path(args.directory).resolve(), hold=args.hold))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcw", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", help="apply the database migrations")
    migrate.add_argument(
        "--status", action="store_true", help="list applied and pending migrations"
    )
    migrate.set_defaults(handler=_cmd_migrate)

    schemas = commands.add_parser("schemas", help="the bus contract's JSON Schemas")
    schemas_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schemas_commands.add_parser("export", help="write every message's JSON Schema to DIR")
    export.add_argument("directory")
    export.set_defaults(handler=_cmd_schemas_export)

    demo = commands.add_parser("demo", help="run the whole flow on embedded NATS and PostgreSQL")
    demo.add_argument("--directory", default=".bcw/demo", help="where the servers keep their data")
    demo.add_argument("--hold", action="store_true", help="keep the servers up until Ctrl-C")
    demo.set_defaults(handler=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except ValueError as error:
        print(f"bcw: bad settings in the environment:\n{error}", file=sys.stderr)
        return 2
    code: int = args.handler(args, settings)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

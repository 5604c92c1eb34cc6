"""`bcw`: the one entry point of bc-workers (migrate, provision, run, demo, bench, …).

Parses arguments, reads settings, and hands over to the command group's handler. The
one place that turns errors into what an operator reads: one line naming the setting,
and an exit code (0 done; 1 failed, e.g. a server out of reach; 2 a bad setting or
usage; 3 credentials or permissions refused). A traceback only with
`BCW_LOG_LEVEL=DEBUG`. Signal handlers are installed by `running.run_workers` alone (`bcw
run` defers the stop signals earlier, in `entry`, before this module's imports).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from pydantic import ValidationError

from workers.cli import (
    authorizing,
    bench,
    operating,
    provisioning,
    quarantining,
    redriving,
    running,
)
from workers.cli.common import EXIT_BAD_SETTINGS, EXIT_FAILED, document
from workers.runtime.base.errors import SettingError, redact
from workers.runtime.base.release import release
from workers.runtime.observability import otel_env
from workers.settings import (
    Settings,
    describe,
    read_secret_files,
    unknown_variables,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcw", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"bcw {release()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (provisioning, authorizing, running, operating, redriving, quarantining, bench):
        group.add(commands)
    document(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        read_secret_files(os.environ)  # BCW_DATABASE_URL_FILE and the like
    except SettingError as error:
        print(f"bcw: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        settings = Settings()
    except ValidationError as error:
        for line in describe(error, os.environ):
            print(redact(f"bcw: {line}"), file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if not settings.database.application_name:  # bcw-liveness, bcw-migrate, …
        database = settings.database.model_copy(update={"application_name": _named(args)})
        settings = settings.model_copy(update={"database": database})
    unknown = unknown_variables(os.environ)
    if unknown:  # a misspelt setting would otherwise be silently ignored
        for line in unknown:
            print(f"bcw: {line}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        otel_env.check(os.environ)  # the standard OTEL_* ones, before the SDK reads them
    except SettingError as error:
        print(f"bcw: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        code: int = args.handler(args, settings)
    except SettingError as error:
        _explain(args.command, str(error))
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout's reader went away: `entry` ends quietly
        raise
    except Exception as error:  # a bug, or a failure nothing above names: still one line
        _explain(args.command, f"{type(error).__name__}: {error}")
        return EXIT_FAILED
    return code


def _named(args: argparse.Namespace) -> str:
    """This process's name in PostgreSQL: `bcw-<worker>` for `bcw run`, else `bcw-<command>`."""
    if args.command == "run":
        return f"bcw-{args.worker}"[:63]
    return f"bcw-{args.command}"[:63]


def _explain(command: str, line: str) -> None:
    if os.environ.get("BCW_LOG_LEVEL", "").upper() == "DEBUG":
        traceback.print_exc()
    print(redact(f"bcw {command}: {line}"), file=sys.stderr)

"""What every command group of `bcw` shares: the documented exit codes and the type of the
subcommand table the groups add their commands to."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta
from typing import TypeAlias

EXIT_FAILED = 1
EXIT_BAD_SETTINGS = 2
EXIT_REFUSED = 3

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


#: an example for every command's help page (a test checks that each has one)
EXAMPLES: dict[str, str] = {
    "migrate": "BCW_DATABASE_URL=postgresql://owner@db/bcw bcw migrate --status",
    "schemas export": "bcw schemas export schemas/json --asyncapi bus.asyncapi.json",
    "provision": "BCW_NATS_NKEY_SEED_FILE=auth/admin.nk bcw provision   # or --check",
    "auth nats": "bcw auth nats --gateways gw-1,gw-2 --out auth/",
    "auth db": "bcw auth db --bind gw1_login=gw-1 --bind gw2_login=gw-2",
    "run": "bcw run liveness          # or: bcw run all, bcw run relay",
    "sim": "bcw sim --scenario power-on --nodes 1000 --gateways 3",
    "demo": "bcw demo --nodes 200 --keep",
    "config": "bcw config --json",
    "dead-letters": "bcw dead-letters redrive --cause unsupported-major --dry-run",
    "dead-letters list": "bcw dead-letters list --worker labeler --json",
    "dead-letters redrive": "bcw dead-letters redrive --cause unsupported-major --dry-run",
    "commands": "bcw commands node-17 --limit 20 --json",
    "explain": "bcw explain node-17 --since 2h",
    "liveness status": "bcw liveness status --gateway gw-3 --json",
    "liveness release": "bcw liveness release --gateway gw-3 --by alice",
    "quarantine status": "bcw quarantine status --gateway gw-3",
    "quarantine release": "bcw quarantine release --node node-17 --by alice",
    "quarantine dismiss": "bcw quarantine dismiss --node node-17 --by alice",
    "events": "bcw events --type 'node.*' --since 10m --json",
    "bench": "bcw bench runtime --embedded",
    "heap diff": "bcw heap diff heap/heap-7-00000600.000.tracemalloc "
    "heap/heap-7-00007200.000.tracemalloc --stacks",
}


def document(commands: Commands, prefix: str = "") -> None:
    """Give every command's help page a description (its one-line help, when it has no
    longer one) and an example (`EXAMPLES`), nested commands included."""
    helps = {action.dest: action.help for action in commands._choices_actions}
    for name, parser in commands.choices.items():
        path = f"{prefix}{name}"
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        if not parser.description:
            parser.description = helps.get(name) or ""
        if path in EXAMPLES:
            parser.epilog = f"example:\n  {EXAMPLES[path]}"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                document(action, f"{path} ")


def since(text: str) -> timedelta:
    """An argument that is a duration (`10s`, `5m`, `2h`; a plain number is seconds),
    more than 0: a bad one exits 2 before any connection (argparse)."""
    from workers.runtime.base.setting_types import parse_since  # a positive duration

    try:
        return parse_since(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_duration(text: str) -> float:
    """The same (`since`), in seconds."""
    return since(text).total_seconds()


def plain(value: object) -> object:
    """A value as JSON carries it: times in ISO 8601, ids as strings."""
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)


def json_line(**fields: object) -> None:
    """Print one JSON object on a line of its own (what every `--json` prints: one object
    per item, its field names in docs/runtime.md), values made `plain`."""
    print(json.dumps({name: plain(value) for name, value in fields.items()}))

"""Daily operations: `bcw config`, `bcw commands`, `bcw explain`, `bcw liveness
release` and `bcw events` — reading what the system did and the few actions an
operator takes on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import datetime

from workers.cli.common import (
    EXIT_FAILED,
    Commands,
    plain,
    positive_duration,
    since,
)
from workers.settings import Settings


def add(commands: Commands) -> None:
    """Register this group's commands."""
    config = commands.add_parser(
        "config",
        help="the effective configuration: every setting's variable and value, secrets as ***",
    )
    config.add_argument("--json", action="store_true", help="one JSON object")
    config.set_defaults(handler=_cmd_config)

    listing = commands.add_parser("commands", help="a node's commands: state, epoch, attempts")
    listing.add_argument("node")
    listing.add_argument("--limit", type=int, default=100, help="the latest this many")
    listing.add_argument("--json", action="store_true", help="one JSON object per command")
    listing.set_defaults(handler=_cmd_commands)

    why = commands.add_parser(
        "explain", help="why a node is where it is: its session and its timeline, with trace ids"
    )
    why.add_argument("node")
    why.add_argument(
        "--since", type=since, default="24h", help="how far back (30m, 1h, 2d; default 24h)"
    )
    why.add_argument("--json", action="store_true", help="print JSON instead of a table")
    why.set_defaults(handler=_cmd_explain)

    live = commands.add_parser("liveness", help="the liveness controller's fleet breaker")
    live_commands = live.add_subparsers(dest="liveness_command", required=True)
    state = live_commands.add_parser(
        "status",
        help="each gateway as the liveness controller sees it: sessions and their oldest "
        "sight, last flush, blindness, breaker, lease",
    )
    state.add_argument("--gateway", help="only this gateway")
    state.add_argument("--json", action="store_true", help="one JSON object per gateway")
    state.set_defaults(handler=_cmd_liveness_status)
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
    start = events.add_mutually_exclusive_group()
    start.add_argument(
        "--since", type=_start, help="from this long ago (10m, 2h, 1d) or this ISO 8601 time"
    )
    start.add_argument(
        "--start-seq",
        type=_sequence,
        metavar="N",
        help="from the event at stream sequence N on (resume with the last `seq` handled + 1)",
    )
    start.add_argument("--all", action="store_true", help="from the start of the stream")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.add_argument("--count", type=int, help="exit after this many events")
    events.add_argument(
        "--idle-exit",
        type=positive_duration,
        help="exit after this long without an event (10s, 2m)",
    )
    events.set_defaults(handler=_cmd_events)


def _cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime.base.settings import database_tls
    from workers.runtime.observability import otel_env
    from workers.settings import effective

    shown = otel_env.shown()  # the OTEL_* it uses too
    tls = {"PostgreSQL TLS": database_tls(settings.database).said()}
    if args.json:  # durations in seconds; the text says them as they were written
        print(json.dumps(effective(settings) | shown | tls, indent=2))
    else:
        values = effective(settings, os.environ) | shown | tls
        width = max(len(name) for name in values)
        for name, value in values.items():
            print(f"{name:<{width}}  {'' if value is None else value}")
    return 0


def _cmd_commands(args: argparse.Namespace, settings: Settings) -> int:
    from workers.replay.commands import list_commands
    from workers.runtime.store import db

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            rows = await list_commands(conn, args.node, args.limit)
        finally:
            await conn.close()
        if args.json:
            for r in rows:
                print(json.dumps({k: plain(v) for k, v in dict(r).items()}))
            return 0
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
    from workers.runtime.store import db
    from workers.tools import explain

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


def _start(text: str) -> datetime:
    from workers.runtime.base.setting_types import parse_start

    try:
        return parse_start(text)
    except ValueError as error:  # argparse: exit 2, before any connection
        raise argparse.ArgumentTypeError(str(error)) from None


def _sequence(text: str) -> int:
    """A stream sequence: a whole number from 1 (argparse: exit 2, before any connection)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream sequence (1, 2, …)")
    return int(text)


def _blind(row: dict[str, object]) -> str:
    """`no`, or why it is blind (`lag`, `no-flush`; `yes` when a release before 0.4 said it)."""
    if not row["blind"]:
        return "no"
    return str(row.get("blind_reason") or "yes")


def _cmd_liveness_status(args: argparse.Namespace, settings: Settings) -> int:
    from workers.liveness.breaker import status
    from workers.runtime.store import db
    from workers.tools.display import printable

    async def run() -> list[dict[str, object]]:
        conn = await db.connect(settings.database)
        try:
            return await status(conn, args.gateway)
        finally:
            await conn.close()

    rows = asyncio.run(run())
    if args.json:
        for row in rows:
            print(json.dumps({k: plain(v) for k, v in row.items()}))
        return 0
    print(
        f"{'gateway':<20} {'connected':>9} {'oldest seen':>11} {'flush age':>9}  {'blind':<8} "
        f"{'breaker':<8} lease"
    )
    for row in rows:
        age = row["last_flush_age_seconds"]
        shown_age = "never" if age is None else f"{float(str(age)):.0f}s"
        oldest = row["oldest_sight_age_seconds"]  # its least recently seen session's sight
        shown_oldest = "-" if oldest is None else f"{float(str(oldest)):.0f}s"
        breaker = (
            "released"
            if row["breaker_released_at"] and row["breaker_open"]
            else "open"
            if row["breaker_open"]
            else "closed"
        )
        lease = "draining" if row["draining"] else "live" if row["lease_live"] else "expired"
        print(
            f"{printable(str(row['gateway_id'])):<20} {row['connected']:>9} {shown_oldest:>11} "
            f"{shown_age:>9}  "
            f"{_blind(row):<8} {breaker:<8} {lease}"
        )
    if not rows:
        print("no gateway known" + (f" as {args.gateway!r}" if args.gateway else ""))
    return 0


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
    from workers.tools import tail

    try:
        return asyncio.run(
            tail.follow(
                settings,
                event_type=args.type,
                node=args.node,
                since=args.since,
                everything=args.all,
                start_seq=args.start_seq,
                as_json=args.json,
                count=args.count,
                idle_exit=args.idle_exit,
            )
        )
    except KeyboardInterrupt:
        return 0

"""Daily operations: `bcw dead-letters`, `bcw commands`, `bcw explain`, `bcw liveness
release` and `bcw events` — reading what the system did and the few actions an
operator takes on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import Any

from workers.cli.common import (
    EXIT_BAD_SETTINGS,
    EXIT_FAILED,
    Commands,
    positive_duration,
    since,
)
from workers.runtime.base.settings import Settings


def add(commands: Commands) -> None:
    """Register this group's commands."""
    config = commands.add_parser(
        "config",
        help="the effective configuration: every setting's variable and value, secrets as ***",
    )
    config.add_argument("--json", action="store_true", help="one JSON object")
    config.set_defaults(handler=_cmd_config)

    dead = commands.add_parser("dead-letters", help="list or re-drive dead-lettered messages")
    dead.add_argument("action", choices=["list", "redrive"])
    dead.add_argument("--worker", help="only this worker's dead letters")
    dead.add_argument(
        "--cause",
        help="only dead letters of this cause (invalid, handler, max-deliveries, unsupported-major)",
    )
    key: dict[str, Any] = {"type": _letter_key, "metavar": "STREAM:SEQ"}
    dead.add_argument("--seq", action="append", help="only this letter (repeatable)", **key)
    dead.add_argument("--limit", type=int, default=1000, help="at most this many (a page)")
    dead.add_argument("--after", help="from the dead letter after this one (paging)", **key)
    dead.add_argument("--all", action="store_true", help="redrive: every dead letter, knowingly")
    dead.add_argument(
        "--dry-run", action="store_true", help="redrive: say what would be re-driven, do nothing"
    )
    dead.add_argument("--yes", action="store_true", help="redrive: ask no confirmation")
    dead.add_argument("--json", action="store_true", help="list: one JSON object per letter")
    dead.set_defaults(handler=_cmd_dead_letters)

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
    from workers.runtime.base.settings import database_tls, effective

    values = {**effective(settings), "PostgreSQL TLS": database_tls(settings.database).said()}
    if args.json:
        print(json.dumps(values, indent=2))
    else:
        width = max(len(name) for name in values)
        for name, value in values.items():
            print(f"{name:<{width}}  {'' if value is None else value}")
    return 0


def _letter_key(text: str) -> tuple[str, int]:
    from workers.runtime.bus import deadletter

    try:
        return deadletter.parse_key(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cmd_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.subjects import Subjects
    from workers.display import printable
    from workers.runtime.bus import connection, deadletter
    from workers.runtime.bus import letters as checks

    chosen = args.worker or args.cause or args.seq
    if args.action == "redrive" and not chosen and not args.all:
        print(
            "bcw dead-letters redrive: say which: --worker, --cause, --seq, or --all",
            file=sys.stderr,
        )
        return EXIT_BAD_SETTINGS  # before any connection: nothing was touched

    async def run() -> int:
        subjects = Subjects(settings.subject_root)
        nc = await connection.connect(settings.nats, name="bcw dead-letters")
        try:
            js = nc.jetstream()
            missing: list[str] = []
            if args.seq:  # looked up directly, wherever they are in their streams
                letters, missing = await deadletter.dead_letters_at(js, subjects, args.seq)
                letters = [
                    x for x in letters
                    if (not args.worker or x.worker == args.worker)
                    and (not args.cause or x.cause == args.cause)
                ]  # fmt: skip
            else:
                letters = await deadletter.list_dead_letters(
                    js, subjects, args.worker, args.limit, args.cause, args.after
                )
            for key in missing:
                print(f"no dead letter at {key}", file=sys.stderr)
            # each letter checked once: the verdict listed is the one a redrive acts on,
            # and a fact's body is read from its stream once
            checked = {letter.key: await checks.checked(js, subjects, letter) for letter in letters}
            verdicts = {seq: why for seq, (why, _body) in checked.items()}
            if args.action == "list" and args.json:
                for letter in letters:
                    print(json.dumps({
                        "stream": letter.stream, "seq": letter.seq, "time": _plain(letter.time), "worker": letter.worker,
                        "cause": letter.cause, "subject": letter.subject,
                        "stream_seq": letter.stream_seq, "reason": letter.reason,
                        "refused": verdicts[letter.key],
                    }))  # fmt: skip
                return EXIT_FAILED if missing else 0
            if args.action == "list":
                for letter in letters:
                    when = letter.time.isoformat(timespec="seconds") if letter.time else "-"
                    print(printable(
                        f"{letter.key} {when} {letter.worker:<12} {letter.cause:<17} "
                        f"{letter.subject}  {letter.reason}"
                    ))  # fmt: skip
                    if verdicts[letter.key] is not None:
                        print(printable(f"{'':>8} REFUSED for redrive: {verdicts[letter.key]}"))
                print(f"{len(letters)} dead letter(s)")
                if refused := sum(1 for why in verdicts.values() if why is not None):
                    print(f"{refused} refused for redrive (their source could not send them)")
                if not args.seq and len(letters) == args.limit:
                    print(f"more may follow: --after {letters[-1].key}")
                return EXIT_FAILED if missing else 0
            if args.dry_run:
                for letter in letters:
                    why = verdicts[letter.key]
                    print(
                        f"would re-drive {letter.key} to {letter.subject}" if why is None
                        else printable(f"would refuse {letter.key}: {why}")
                    )  # fmt: skip
                good = sum(1 for why in verdicts.values() if why is None)
                print(f"{good} would be re-driven (--dry-run: nothing was)")
                return 0
            if letters and sys.stdin.isatty() and not args.yes:
                question = f"re-drive {len(letters)} dead letter(s)? [y/N] "
                answer = await asyncio.to_thread(input, question)
                if answer.strip().lower() not in ("y", "yes"):
                    print("nothing re-driven")
                    return 0
            refused = 0
            for letter in letters:
                why, body = checked[letter.key]
                if why is not None or body is None:
                    print(
                        printable(f"not re-driven: dead letter {letter.key}: {why}"),
                        file=sys.stderr,
                    )
                    refused += 1
                    continue
                await deadletter.resend(js, subjects, letter, body)
                print(f"re-drove {letter.key} to {letter.subject}")
            print(f"{len(letters) - refused} re-driven")
            return EXIT_FAILED if refused or missing else 0
        finally:
            await nc.close()

    return asyncio.run(run())


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
                print(json.dumps({k: _plain(v) for k, v in dict(r).items()}))
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


def _plain(value: object) -> object:
    """A value as JSON carries it: times in ISO 8601, ids as strings."""
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)


def _start(text: str) -> datetime:
    from workers.explain import parse_start

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
    from workers.display import printable
    from workers.liveness.breaker import status
    from workers.runtime.store import db

    async def run() -> list[dict[str, object]]:
        conn = await db.connect(settings.database)
        try:
            return await status(conn, args.gateway)
        finally:
            await conn.close()

    rows = asyncio.run(run())
    if args.json:
        for row in rows:
            print(json.dumps({k: _plain(v) for k, v in row.items()}))
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
            "released" if row["breaker_released_at"] and row["breaker_open"]
            else "open" if row["breaker_open"] else "closed"
        )  # fmt: skip
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
    from workers import tail

    try:
        return asyncio.run(
            tail.follow(
                settings, event_type=args.type, node=args.node, since=args.since, everything=args.all,
                start_seq=args.start_seq,
                as_json=args.json, count=args.count, idle_exit=args.idle_exit,
            )
        )  # fmt: skip
    except KeyboardInterrupt:
        return 0

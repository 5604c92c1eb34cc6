"""`bcw quarantine status|release|dismiss`: the quarantines the breaker holds for an
operator — each holds every session of its node — their release (the quarantine worker
then revokes them) and their dismissal (judged no clone: nothing revoked, the node's
sessions get their commands again). The SQL is the quarantine's own
(`workers/quarantine/operator.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from workers.cli.common import EXIT_BAD_SETTINGS, EXIT_FAILED, Commands, json_line
from workers.settings import Settings


def add(commands: Commands) -> None:
    """Register this group's commands."""
    quarantine = commands.add_parser(
        "quarantine", help="quarantines held by the breaker for an operator"
    )
    sub = quarantine.add_subparsers(dest="quarantine_command", required=True)
    status = sub.add_parser("status", help="the quarantines whose revocation waits")
    status.add_argument("--node", help="only this node's")
    status.add_argument("--gateway", help="only those blamed on this gateway")
    status.add_argument("--json", action="store_true", help="one JSON object per quarantine")
    status.set_defaults(handler=_cmd_status)
    release = sub.add_parser(
        "release", help="let the quarantine worker revoke what the breaker holds (chosen ones)"
    )
    release.add_argument("--node", help="this node's held quarantine")
    release.add_argument("--gateway", help="those blamed on this gateway")
    release.add_argument("--all", action="store_true", help="every held quarantine")
    release.add_argument("--by", help="who releases them (recorded); default user@host")
    release.set_defaults(handler=_cmd_release, verb="release")
    dismiss = sub.add_parser(
        "dismiss",
        help="judge held quarantines no clone: nothing is revoked, and the hold on every "
        "session of their nodes ends",
    )
    dismiss.add_argument("--node", help="this node's held quarantine")
    dismiss.add_argument("--gateway", help="those blamed on this gateway")
    dismiss.add_argument("--all", action="store_true", help="every held quarantine")
    dismiss.add_argument("--by", help="who dismisses them (recorded); default user@host")
    dismiss.set_defaults(handler=_cmd_release, verb="dismiss")


def _cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from workers.quarantine import operator
    from workers.runtime.store import db

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            rows = await operator.held(conn, args.node, args.gateway)
        finally:
            await conn.close()
        if args.json:
            for row in rows:
                json_line(**dict(row))
            return 0
        for row in rows:
            print(
                f"{row['node_id']}  epoch {row['epoch']}  {row['held']:<11} via {row['gateway_id']}"
                f"  alternations {row['alternations']} through {', '.join(row['gateways']) or '?'}"
                f"  serials {', '.join(row['serials']) or '-'}  {row['decided_at']:%Y-%m-%d %H:%M:%S%z}"
            )
        if not rows:
            print("no quarantine is held")
        return 0

    return asyncio.run(run())


def _cmd_release(args: argparse.Namespace, settings: Settings) -> int:
    import getpass
    import socket

    from workers.quarantine import operator
    from workers.runtime.store import db

    verb = args.verb
    if not (args.node or args.gateway or args.all):
        print(f"bcw quarantine {verb}: say which: --node, --gateway or --all", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    who = args.by or f"{getpass.getuser()}@{socket.gethostname()}"

    async def run() -> int:
        conn = await db.connect(settings.database)
        try:
            done = await operator.end(conn, verb, args.node, args.gateway, who)
        finally:
            await conn.close()
        if not done:
            print(f"bcw quarantine {verb}: no held quarantine matches", file=sys.stderr)
            return EXIT_FAILED
        nodes = ", ".join(sorted(done))
        if verb == "release":
            print(f"released by {who}: {nodes}; the quarantine worker revokes them")
        else:
            print(
                f"dismissed by {who}: {nodes}; nothing revoked, their sessions get commands again"
            )
        return 0

    return asyncio.run(run())

"""`bcw explain NODE`: why a node is where it is — its session now, and its timeline.

The timeline is the node's session history (written by the workers in the same
transactions as their effects, one row of `session_history_packs` a transaction):
connections and disconnections with their reasons, capability changes, counted
duplicates, quarantine, commands replayed, dispatched, failed, cancelled, completed —
each with its epoch, gateway, the worker that wrote it, the fact that caused it and the
trace id to open in the tracing backend.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

#: each entry of each history pack (one row a transaction), as a row: `p` the pack, `h`
#: the entry, `h.n` its place in the pack
_PACK_ENTRIES = """session_history_packs p,
       unnest(p.node_ids, p.whats, p.epochs, p.gateway_ids, p.fact_ids, p.trace_ids, p.details)
         WITH ORDINALITY AS h(node_id, what, epoch, gateway_id, fact_id, trace_id, detail, n)"""

#: a node's history: the entries of the packs that name it (found through the index of
#: their node ids) and the rows an older release wrote (`session_history`), in the order
#: they were written
TIMELINE = f"""
SELECT p.at, h.what, h.epoch, h.gateway_id, p.worker, h.fact_id, h.trace_id, h.detail,
       p.id, h.n
  FROM {_PACK_ENTRIES}
 WHERE p.node_ids @> ARRAY[$1::text] AND h.node_id = $1
   AND p.at >= compute_now() - $2::interval
UNION ALL
SELECT at, what, epoch, gateway_id, worker, fact_id, trace_id, detail::text, id, 0
  FROM session_history
 WHERE node_id = $1 AND at >= compute_now() - $2::interval
 ORDER BY 1, 9, 10
"""

#: every history entry of every node, one row each, from both tables (as `TIMELINE`): for
#: counting and reading the whole history, `SELECT … FROM {HISTORY}`
HISTORY = f"""(
SELECT h.node_id, p.at, h.what, h.epoch, h.gateway_id, p.worker, h.fact_id, h.trace_id,
       h.detail::jsonb AS detail
  FROM {_PACK_ENTRIES}
UNION ALL
SELECT node_id, at, what, epoch, gateway_id, worker, fact_id, trace_id, detail
  FROM session_history
) AS history"""

# its last sight as the rest of the control plane reads it (`node_last_seen`, migration
# 0050): its row's, or its gateway's range row's
SESSION = """
SELECT s.session_epoch, s.gateway_id, s.connected_at,
       (SELECT v.last_seen FROM node_last_seen v WHERE v.node_id = s.node_id) AS last_seen,
       s.disconnected_at,
       s.disconnect_reason, s.held_epoch, s.duplicate_hellos, s.cert_serial, s.proven,
       EXISTS (SELECT 1 FROM quarantines q WHERE q.node_id = s.node_id
                  AND q.revoked_at IS NULL AND q.dismissed_at IS NULL) AS held_for_operator,
       is_revoked(s.cert_serial) AS revoked, compute_now() AS now,
       coalesce((SELECT array_agg(c.condition ORDER BY c.condition) FROM node_conditions c
                  WHERE c.node_id = s.node_id), '{}') AS conditions
  FROM node_sessions s WHERE s.node_id = $1
"""


@dataclass(frozen=True)
class Step:
    at: datetime
    what: str
    epoch: int | None
    gateway_id: str | None
    worker: str
    summary: str
    fact_id: str | None
    trace_id: str | None


def describe(what: str, detail: Mapping[str, Any]) -> str:
    """One line saying what a history entry means, from the message as published. Pure."""
    reason = detail.get("reason")
    if what == "node.connected":
        flags = [
            name
            for name, key in (
                ("journal changed", "journalChanged"),
                ("reboot", "bootChanged"),
                ("duplicate identity", "duplicateIdentity"),
            )
            if detail.get(key)
        ]
        return f"boot {detail.get('bootId')}" + (f" ({', '.join(flags)})" if flags else "")
    if what == "node.disconnected":
        return str(reason)
    if what == "node.capabilities-changed":
        added = " ".join(f"+{name}" for name in detail.get("added", []))
        removed = " ".join(f"-{name}" for name in detail.get("removed", []))
        return " ".join(part for part in (added, removed) if part) or "unchanged"
    if what == "security.node.duplicate-session":
        state = "quarantined" if detail.get("quarantined") else "counted"
        state += ", held for an operator" if detail.get("held") else ""
        return (
            f"alternation {detail.get('alternations')} in {detail.get('windowSeconds')} s "
            f"({state}): boot {detail.get('previousBootId')} → {detail.get('bootId')}"
        )
    if what == "security.node.unproven-hello":
        return f"unproven Hello (a takeover attempt, held): boot {detail.get('bootId')}"
    if what == "security.node.quarantined":
        serials = ", ".join(detail.get("revokedSerials", [])) or "none"
        return f"{reason}: revoked {serials}"
    if what.startswith("command.") or what == "dispatch":
        kind = detail.get("kind")
        seq = detail.get("seq")
        attempt = detail.get("attempt")
        text = f"{kind} #{seq} attempt {attempt}"
        return f"{text}: {reason}" if reason else text
    if what == "zombie":
        return "the gateway held a session this epoch no longer matches: fenced"
    return ""


async def timeline(conn: asyncpg.Connection, node_id: str, since: timedelta) -> list[Step]:
    steps = []
    for row in await conn.fetch(TIMELINE, node_id, since):
        detail = json.loads(row["detail"])
        steps.append(
            Step(
                at=row["at"],
                what=row["what"],
                epoch=row["epoch"],
                gateway_id=row["gateway_id"],
                worker=row["worker"],
                summary=describe(row["what"], detail),
                fact_id=str(row["fact_id"]) if row["fact_id"] else None,
                trace_id=row["trace_id"],
            )
        )
    return steps


async def session(conn: asyncpg.Connection, node_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(SESSION, node_id)
    return dict(row) if row is not None else None


def state_line(row: Mapping[str, Any] | None) -> str:
    """The node's session now, in one line. Pure."""
    if row is None:
        return "no such node (never joined, or removed)"
    if row["gateway_id"] is not None:
        line = (
            f"connected via {row['gateway_id']} at epoch {row['session_epoch']}, "
            f"last seen {_ago(row['now'] - row['last_seen'])} ago"
        )
        if row.get("proven") is False:
            line += ", unproven for a node that proves its Hellos (a takeover attempt, held)"
        elif row["held_epoch"] is not None:
            line += ", held for the quarantine (duplicate identity)"
        if row.get("held_for_operator"):
            line += ", held for an operator (bcw quarantine release|dismiss)"
    elif row["disconnected_at"] is not None:
        line = (
            f"disconnected ({row['disconnect_reason']}) {_ago(row['now'] - row['disconnected_at'])}"
            f" ago, last epoch {row['session_epoch']}"
        )
    else:
        line = "never connected"
    if row["revoked"]:
        line += f"; certificate {row['cert_serial']} revoked"
    if row.get("conditions"):
        line += f"; condition {', '.join(row['conditions'])}"
    return line


def _ago(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def state_fields(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The node's session now as fields a program reads (None: no such node). Pure."""
    if row is None:
        return None

    def when(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "connected": row["gateway_id"] is not None,
        "epoch": row["session_epoch"],
        "gateway_id": row["gateway_id"],
        "connected_at": when(row.get("connected_at")),
        "last_seen": when(row.get("last_seen")),
        "disconnected_at": when(row["disconnected_at"]),
        "disconnect_reason": row["disconnect_reason"],
        "held_for_quarantine": row["held_epoch"] is not None,
        "held_for_operator": bool(row.get("held_for_operator")),
        "proven": row.get("proven"),
        "alternations": row.get("duplicate_hellos"),
        "cert_serial": row.get("cert_serial"),
        "cert_revoked": bool(row["revoked"]),
        "conditions": list(row.get("conditions") or []),  # DuplicateIdentity: quarantined
    }


def as_json(node_id: str, row: Mapping[str, Any] | None, steps: Sequence[Step]) -> str:
    return json.dumps(
        {
            "node_id": node_id,
            "state": state_fields(row),
            "summary": state_line(row),  # the same, in a sentence
            "timeline": [{**asdict(s), "at": s.at.isoformat()} for s in steps],
        },
        indent=2,
    )


def render(node_id: str, row: Mapping[str, Any] | None, steps: Sequence[Step], since: str) -> None:
    """Print the node's state and its timeline as a table (rich)."""
    from rich.console import Console
    from rich.table import Table

    from workers.tools.display import plain

    # piped (grep, less): wide enough that no line folds
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(f"[bold]{plain(node_id)}[/bold]: {plain(state_line(row))}")
    if not steps:
        console.print(f"nothing recorded in the last {since}")
        return
    table = Table(show_lines=False, header_style="bold")
    for column in ("time", "what", "epoch", "gateway", "worker", "detail", "trace id"):
        table.add_column(column, overflow="fold", no_wrap=column != "detail")
    for step in steps:
        table.add_row(  # what nodes and gateways said, shown as text: no markup, no controls
            step.at.strftime("%Y-%m-%d %H:%M:%S"),
            plain(step.what),
            "" if step.epoch is None else str(step.epoch),
            plain(step.gateway_id or ""),
            plain(step.worker),
            plain(step.summary),
            plain(step.trace_id or ""),
        )
    console.print(table)

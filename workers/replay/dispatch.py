"""The dispatch loop: pending commands to connected nodes, in the replica holding the
`replay-dispatch` lease (so no command is dispatched twice by two replicas).

A round: fence on the lease; pick nodes with pending commands whose back-off has passed;
lock their session rows FOR SHARE (a Hello's epoch bump waits for us, and we for it),
skipping sessions on a gateway whose lease expired; plan each node with the pure rules
(seq order, credits per lane as the daemon's heartbeats report them, eligibility, a
lane waits while older commands await their replay); mark the
chosen commands dispatched at the session's current epoch, a delivery in their history —
the write re-checks that they are still pending — and queue their dispatch notices to the gateway the session is
routed to at that moment. Woken by NOTIFY (new commands, Hellos, results, BUSY answers)
and by the earliest back-off expiring.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import asyncpg

from schemas.events import CommandCancelled
from schemas.subjects import Subjects
from workers.replay.apply import DISPATCH_CHANNEL, command_event, command_from_row, dispatch_notice
from workers.replay.decide import Command, Session, lane_limits, plan_dispatch
from workers.replay.deliveries import KEPT
from workers.replay.holds import HoldMetrics, release_expired_holds
from workers.replay.lost import LostHelloSearch
from workers.replay.settings import ReplaySettings
from workers.runtime.base.waiting import wait_any
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.worker import Loop, Runtime
from workers.runtime.observability import tracing
from workers.runtime.store import leases
from workers.runtime.store.notify import Listener

log = logging.getLogger(__name__)

LEASE = "replay-dispatch"
ENQUEUE_CHANNEL = "commands"  # a new command (`wake_channels`, migration 0057)

# Nodes with a pending command whose back-off has passed and a connected session, from
# a cursor on: successive rounds go round the fleet, so nodes whose commands must wait
# (no session can take them yet) cannot starve the others.
READY_NODES = """
SELECT DISTINCT c.node_id
  FROM commands c
  JOIN node_sessions s ON s.node_id = c.node_id AND s.gateway_id IS NOT NULL
 WHERE c.state = 'pending' AND (c.not_before IS NULL OR c.not_before <= compute_now())
   AND c.node_id > $2
 ORDER BY c.node_id
 LIMIT $1
"""

# A session held for the quarantine (its Hello was a duplicate identity, not yet counted,
# or quarantined) gets nothing, nor one that presented a revoked certificate (its gateway
# drops it on the revocation notice; until then it is nobody's to send to), nor an
# unproven one of a node that proves its Hellos (`proven = false`: a takeover attempt,
# whatever its hold says), nor any session of a node a quarantine holds for an operator
# (neither revoked nor dismissed: every session of the node, not only its epoch's).
# Sessions routed to a gateway whose lease has expired get nothing: the gateway may be
# gone, and its sessions are moving (or the liveness controller's gateway-loss rule will
# disconnect them). A gateway without a lease row at all has not expired.
LOCK_CONNECTED = """
SELECT s.node_id, s.session_epoch, s.gateway_id, s.transport, s.upgrade_required, c.allowed_kinds,
       s.lane_credits::text AS lane_credits, compute_now() AS now, s.trace_context, s.connected_at
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT * FROM node_sessions
                      WHERE node_id = n.node_id AND gateway_id IS NOT NULL AND session_epoch > 0
                        AND held_epoch IS NULL AND proven IS DISTINCT FROM false
                      FOR SHARE) AS s
  LEFT JOIN node_certs c ON c.serial = s.cert_serial
  LEFT JOIN gateways g ON g.gateway_id = s.gateway_id
 WHERE (g.gateway_id IS NULL OR g.lease_expires_at > compute_now()) AND c.revoked_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM quarantines q WHERE q.node_id = s.node_id
                      AND q.revoked_at IS NULL AND q.dismissed_at IS NULL)
"""

PENDING_OF = """
SELECT c.* FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT command_id, node_id, seq, kind, lane, state, session_epoch, delivery_attempt,
                            busy_attempts, busy_epoch, not_before, payload::text AS payload, signature,
                            trace_context, created_at
                       FROM commands WHERE node_id = n.node_id AND state = 'pending' ORDER BY seq) AS c
"""

# Per node and lane: commands in flight, and whether one of them is at an epoch older
# than the session's (its replay is still to come: the lane waits for it).
IN_FLIGHT_COUNTS = """
SELECT c.node_id, c.lane, count(*) AS n, bool_or(c.session_epoch < t.epoch) AS awaiting_replay,
       count(*) FILTER (WHERE c.state IN ('acked', 'running')) AS on_daemon
  FROM unnest($1::text[], $2::bigint[]) AS t(node_id, epoch)
  JOIN commands c ON c.node_id = t.node_id AND c.state IN ('dispatched', 'acked', 'running')
 GROUP BY c.node_id, c.lane
"""

# Command rows are locked in (node, seq) order, as the replay locks them (an UPDATE … FROM
# would lock them in its join's order and could deadlock with a replica's replay). The
# delivery joins the command's history (`deliveries`): appended, as epochs only rise,
# once, the latest KEPT kept.
MARK_DISPATCHED = f"""
WITH locked AS (
    SELECT c.command_id, t.epoch
      FROM commands c JOIN unnest($1::uuid[], $2::bigint[]) AS t(id, epoch) ON c.command_id = t.id
     WHERE c.state = 'pending'
     ORDER BY c.node_id, c.seq
       FOR UPDATE OF c
)
UPDATE commands c
   SET state = 'dispatched', session_epoch = l.epoch, delivery_attempt = c.delivery_attempt + 1,
       delivered_epochs = CASE WHEN l.epoch = ANY (c.delivered_epochs) THEN c.delivered_epochs
           ELSE (c.delivered_epochs || l.epoch)[greatest(1, cardinality(c.delivered_epochs) + 2 - {KEPT}):]
       END,
       updated_at = now()
  FROM locked l
 WHERE c.command_id = l.command_id
RETURNING c.command_id, c.delivery_attempt
"""

CANCEL = """
WITH locked AS (
    SELECT command_id FROM commands WHERE command_id = ANY($1::uuid[]) AND state = 'pending'
     ORDER BY node_id, seq
       FOR UPDATE
)
UPDATE commands SET state = 'cancelled', failure_reason = 'kind-not-allowed', updated_at = now()
 WHERE command_id IN (SELECT command_id FROM locked)
RETURNING command_id, compute_now() AS at
"""

NEXT_DUE = "SELECT min(not_before) - compute_now() FROM commands WHERE state = 'pending' AND not_before > compute_now()"


@dataclass(frozen=True)
class Waited:
    """What a pending command waited for: its creation, its last BUSY answer."""

    created_at: datetime
    busy_epoch: int | None
    trace_context: str | None  # the BUSY answer's, when it went back to pending so


def dispatch_cause(waited: Waited, session: Mapping[str, Any]) -> str | None:
    """The trace a dispatch continues (a traceparent), pure: the BUSY answer's at this
    session's epoch; else the Hello's, when the command was waiting for the node (made
    before the session opened); else none (a command made while the node was connected
    starts a trace of its own)."""
    if waited.trace_context and waited.busy_epoch == session["session_epoch"]:
        return waited.trace_context
    if session["connected_at"] is not None and waited.created_at <= session["connected_at"]:
        return cast(str | None, session["trace_context"])
    return None


@dataclass(frozen=True)
class RoundResult:
    dispatched: int
    cancelled: int
    nodes: int
    last_node: str = ""  # the cursor for the next round ("" to start over)


async def dispatch_round(
    pool: asyncpg.Pool,
    lease: leases.Lease | None,
    subjects: Subjects,
    settings: ReplaySettings,
    after: str = "",
) -> RoundResult:
    """One dispatch round in one transaction; `LeaseLost` if `lease` is no longer current."""
    async with pool.acquire() as conn, conn.transaction():
        if lease is not None:
            await leases.fence(conn, lease)
        ready = [
            r["node_id"] for r in await conn.fetch(READY_NODES, settings.nodes_per_round, after)
        ]
        if not ready:
            return RoundResult(0, 0, 0)
        cursor = ready[-1] if len(ready) >= settings.nodes_per_round else ""
        sessions = {r["node_id"]: r for r in await conn.fetch(LOCK_CONNECTED, ready)}
        if not sessions:
            return RoundResult(0, 0, len(ready), cursor)
        nodes = sorted(sessions)
        pending: dict[str, list[Command]] = {}
        waits: dict[uuid.UUID, Waited] = {}  # what each pending command waited for
        for record in await conn.fetch(PENDING_OF, nodes):
            pending.setdefault(record["node_id"], []).append(command_from_row(record))
            waits[record["command_id"]] = Waited(
                record["created_at"], record["busy_epoch"], record["trace_context"]
            )
        in_flight: dict[str, dict[str, int]] = {}
        awaiting: dict[str, set[str]] = {}
        on_daemon: dict[str, dict[str, int]] = {}
        epochs = [sessions[node]["session_epoch"] for node in nodes]
        for record in await conn.fetch(IN_FLIGHT_COUNTS, nodes, epochs):
            in_flight.setdefault(record["node_id"], {})[record["lane"]] = record["n"]
            on_daemon.setdefault(record["node_id"], {})[record["lane"]] = record["on_daemon"]
            if record["awaiting_replay"]:
                awaiting.setdefault(record["node_id"], set()).add(record["lane"])
        chosen: list[tuple[Command, asyncpg.Record]] = []
        cancel: list[tuple[Command, asyncpg.Record]] = []
        for node in nodes:
            row = sessions[node]
            session = Session(
                node_id=node,
                epoch=row["session_epoch"],
                gateway_id=row["gateway_id"],
                transport=row["transport"] or "grpc",
                upgrade_required=row["upgrade_required"],
                allowed_kinds=frozenset(row["allowed_kinds"])
                if row["allowed_kinds"] is not None
                else None,
            )
            now: datetime = row["now"]
            plan = plan_dispatch(
                session,
                pending.get(node, []),
                in_flight.get(node, {}),
                settings.credits,
                now,
                awaiting.get(node, set()),
                lane_limits(
                    json.loads(row["lane_credits"]) if row["lane_credits"] else None,
                    on_daemon.get(node, {}),
                    settings.credits,
                ),
            )
            chosen += [(c, row) for c in plan.dispatch]
            cancel += [(c, row) for c in plan.cancel]
        outbox = OutboxBatch("replay")
        marked = {
            r["command_id"]: r["delivery_attempt"]
            for r in await conn.fetch(
                MARK_DISPATCHED,
                [c.command_id for c, _ in chosen],
                [r["session_epoch"] for _, r in chosen],
            )
        }
        for command, row in chosen:  # seq order within each node
            if command.command_id not in marked:
                continue
            sent = dataclasses.replace(command, delivery_attempt=marked[command.command_id])
            notice = dispatch_notice(sent, row["session_epoch"])
            cause = dispatch_cause(waits[command.command_id], row)
            outbox.add(
                notice,
                subjects.notice(row["gateway_id"], notice.BC_TYPE),
                order_key=command.node_id,
                context=tracing.from_traceparent(cause),
            )
        cancelled = {
            r["command_id"]: r["at"]
            for r in await conn.fetch(CANCEL, [c.command_id for c, _ in cancel])
        }
        for command, row in cancel:
            if command.command_id in cancelled:
                event = command_event(
                    CommandCancelled,
                    command,
                    row["session_epoch"],
                    "kind-not-allowed",
                    at=cancelled[command.command_id],
                )
                outbox.add(event, subjects.event(event.BC_TYPE), order_key=command.node_id)
        await outbox.write(conn)
    return RoundResult(len(marked), len(cancelled), len(nodes), cursor)


async def next_due(pool: asyncpg.Pool) -> float | None:
    """Seconds until the earliest back-off of a pending command expires, if any."""
    async with pool.acquire() as conn:
        due: timedelta | None = await conn.fetchval(NEXT_DUE)
    return due.total_seconds() if due is not None else None


def dispatch_loop(settings: ReplaySettings) -> Loop:
    async def dispatch(runtime: Runtime, stopping: asyncio.Event) -> None:
        wake = asyncio.Event()
        listener = Listener(runtime.settings.database, [DISPATCH_CHANNEL, ENQUEUE_CHANNEL], wake)
        listening = asyncio.create_task(listener.run(stopping))
        hold = max(0.5, settings.lease_ttl.total_seconds() / 3)

        cursor = ""
        lost_hellos = LostHelloSearch()

        next_look = time.monotonic() + settings.hello_check_interval

        async def body(lease: leases.Lease) -> None:
            """Dispatch while woken, for a third of the lease; then the lease is renewed.
            Now and then, look for sessions whose Hello never came (`lost.py`) and for
            holds over their bound (`holds.py`)."""
            nonlocal cursor, next_look
            until = time.monotonic() + hold
            while time.monotonic() < until and not stopping.is_set():
                if time.monotonic() >= next_look:
                    next_look = time.monotonic() + settings.hello_check_interval
                    asked = await lost_hellos.ask(
                        runtime.pool, runtime.js, lease, runtime.subjects, settings
                    )
                    released = await release_expired_holds(
                        runtime.pool,
                        lease,
                        runtime.subjects,
                        settings.hold_max,
                        settings.nodes_per_round,
                    )
                    if released:
                        runtime.metrics.of(HoldMetrics).holds_expired.inc(by=len(released))
                    if asked or released:
                        runtime.wake_outbox()
                wake.clear()
                result = await dispatch_round(
                    runtime.pool, lease, runtime.subjects, settings, cursor
                )
                cursor = result.last_node
                if result.dispatched or result.cancelled:
                    runtime.wake_outbox()
                if cursor:
                    continue  # more nodes are ready than one round serves
                due = await next_due(runtime.pool)
                pause = min(settings.dispatch_interval, until - time.monotonic())
                if due is not None:
                    pause = min(pause, due)
                await wait_any((wake, stopping), pause)

        try:
            await leases.run_leased(
                runtime.pool,
                LEASE,
                runtime.instance,
                body,
                period=0.05,
                ttl=settings.lease_ttl,
                stopping=stopping,
                held=runtime.metrics.lease_held,
            )
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

    return dispatch

"""The breaker for revocations: each quarantine the enforcer decides is recorded
(`quarantines`), and revoked at once only while the rule `decide.hold_revocation` allows
it; otherwise it is held for an operator — every session of its node held with it — `security.quarantine.held`, the first of a
gateway's window also `security.quarantine.breaker-open`, the gauge
`bcw_quarantines_held` and its alert — until `bcw quarantine release`, after which the
release loop here (leased: one replica) revokes it, or `bcw quarantine dismiss` (judged no
clone: nothing is revoked, the node's sessions get their commands again).

Called by `apply` inside the batch's transaction, and by the worker's release loop. The
breaker's count is taken with the one row of `quarantine_breaker` locked for the
transaction, so that two replicas deciding at once do not both see room for one more:
only the quarantine's group (and the owner) may lock it — an advisory key, which any
login may take, stopped every quarantine while one held it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from schemas.events import QuarantineBreakerOpen, Quarantined, QuarantineHeld, Revocations
from workers.quarantine import conditions, proofs
from workers.quarantine.decide import BREAKER, REASON, Breaker, hold_revocation
from workers.quarantine.metrics import QuarantineMetrics
from workers.runtime.effects import watermarks
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.worker import Loop, Runtime, Tx
from workers.runtime.store import leases

log = logging.getLogger(__name__)

# The breaker's lock, for the transaction (migration 0055; the quarantine's group alone).
LOCK = "SELECT one FROM quarantine_breaker FOR UPDATE"
# Revocations made at once in the window, per gateway; the fleet's size (an estimate).
RECENT = """
SELECT q.gateway_id, count(*)::int AS revoked FROM quarantines q
 WHERE q.held IS NULL AND q.decided_at > compute_now() - $1::interval
 GROUP BY q.gateway_id
"""
FLEET = "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'nodes'::regclass"
# Whether the gateway already had a quarantine held by the breaker in the window.
OPEN_ALREADY = """
SELECT EXISTS (SELECT 1 FROM quarantines q WHERE q.gateway_id = $1 AND q.held = 'breaker'
                  AND q.decided_at > compute_now() - $2::interval)
"""
RECORD = """
INSERT INTO quarantines (node_id, epoch, gateway_id, alternations, gateways, serials, held,
                         revoked_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $7::text IS NULL THEN compute_now() END)
ON CONFLICT (node_id, epoch) DO NOTHING
"""

# Every live certificate of one node among `serials` (or a serial with no record), revoked;
# never another node's. As `apply.REVOKE`, one node at a time.
REVOKE_RELEASED = """
INSERT INTO node_certs AS c
       (serial, node_id, identity_generation, role, allowed_kinds, not_after, revoked_at, revocation_reason)
SELECT r.serial, n.node_id, n.identity_generation, n.role, '{}', compute_now(), compute_now(), $3
  FROM unnest($1::text[]) AS r(serial)
  JOIN nodes n ON n.node_id = $2
ON CONFLICT (serial) DO UPDATE
   SET revoked_at = compute_now(), revocation_reason = EXCLUDED.revocation_reason
 WHERE c.revoked_at IS NULL AND c.node_id = EXCLUDED.node_id
"""
RELEASED = """
SELECT q.node_id, q.epoch, q.alternations, q.serials, compute_now() AS now FROM quarantines q
 WHERE q.revoked_at IS NULL AND q.released_at IS NOT NULL AND q.dismissed_at IS NULL
 ORDER BY q.decided_at LIMIT 100
   FOR UPDATE SKIP LOCKED
"""
# A quarantine an operator dismissed (judged no clone) holds nothing: the session it held
# at its epoch is released (never a takeover attempt, nor a later duplicate's session the
# quarantine has not counted yet).
LIFT_DISMISSED = """
UPDATE node_sessions s SET held_epoch = NULL
  FROM quarantines q
 WHERE q.dismissed_at IS NOT NULL AND q.node_id = s.node_id AND s.held_epoch = q.epoch
   AND s.proven IS DISTINCT FROM false
"""
MARK_REVOKED = "UPDATE quarantines SET revoked_at = compute_now() WHERE node_id = $1 AND epoch = $2"
HELD = """
SELECT count(*) FROM quarantines
 WHERE revoked_at IS NULL AND released_at IS NULL AND dismissed_at IS NULL
"""


async def hold(
    tx: Tx,
    node_id: str,
    epoch: int,
    gateway_id: str,
    gateways: Sequence[str],
    serials: Sequence[str],
    alternations: int,
    breaker: Breaker,
    proven: bool = False,
    at: datetime | None = None,
) -> str | None:
    """Decide and record a quarantine of `node_id` (acted on at `epoch`, blamed on
    `gateway_id`: `decide.blamed`; `proven`: its window's alternations all were; `at`: when
    its Hello was stored): None when it revokes now (the
    caller revokes and publishes), else why it is held (its events are queued here)."""
    conn = tx.conn
    await conn.execute(LOCK)
    recent = {row["gateway_id"]: row["revoked"] for row in await conn.fetch(RECENT, breaker.window)}
    fleet = int(await conn.fetchval(FLEET))
    held = hold_revocation(gateways, gateway_id, recent, fleet, breaker, proven)
    opened = held == BREAKER and not await conn.fetchval(OPEN_ALREADY, gateway_id, breaker.window)
    await conn.execute(
        RECORD, node_id, epoch, gateway_id, alternations, list(gateways), list(serials), held
    )
    if held is None:
        return None
    log.warning(
        "quarantine of node %s held for an operator (%s; alternations through %s): "
        "bcw quarantine release",
        node_id,
        held,
        ", ".join(gateways) or "?",
    )
    event = QuarantineHeld(
        node_id=node_id,
        gateway_id=gateway_id,
        reason=held,  # type: ignore[arg-type]  # one of the two reasons
        alternations=alternations,
        gateways=list(gateways),
        serials=list(serials),
        at=at,
    )
    tx.publish(event, tx.subjects.event(event.BC_TYPE), order_key=node_id)
    if opened:
        notice = QuarantineBreakerOpen(
            gateway_id=gateway_id,
            revoked=recent.get(gateway_id, 0),
            window_seconds=int(breaker.window.total_seconds()),
            at=at,
        )
        tx.publish(notice, tx.subjects.event(notice.BC_TYPE), order_key=gateway_id)
    return held


async def revoke_released(runtime: Runtime, lease: leases.Lease, window: timedelta) -> int:
    """Revoke what an operator released, each with its events (and its node's condition);
    release the session a dismissed quarantine held; clear the condition of nodes that
    hold a good session again (or no duplicate for the counting `window`); how many revoked."""
    outbox = OutboxBatch("quarantine")
    async with runtime.pool.acquire() as conn, conn.transaction():
        await leases.fence(conn, lease)
        rows = await conn.fetch(RELEASED)
        for row in rows:
            serials = list(row["serials"])
            await conn.execute(REVOKE_RELEASED, serials, row["node_id"], REASON)
            await conn.execute(MARK_REVOKED, row["node_id"], row["epoch"])
            await conditions.set_duplicate_identity(conn, [(row["node_id"], row["epoch"])], REASON)
            event = Quarantined(
                node_id=row["node_id"],
                reason=REASON,
                alternations=row["alternations"],
                revoked_serials=serials,
                at=row["now"],  # revoked now, as its certificates say (`REVOKE_RELEASED`)
            )
            outbox.add(event, runtime.subjects.event(event.BC_TYPE), order_key=row["node_id"])
            notice = Revocations(
                node_id=row["node_id"], serials=serials, reason=REASON, at=row["now"]
            )
            outbox.add(notice, runtime.subjects.revocations, order_key=row["node_id"])
        if rows:
            await outbox.write(conn)
        if (await conn.execute(LIFT_DISMISSED)) != "UPDATE 0":
            await conn.execute("SELECT wake_dispatch()")  # what waits may go
        held = int(await conn.fetchval(HELD))
        # re-joined machines, and nodes with no duplicate for a window, hold good sessions
        await conditions.clear_recovered(conn, window)
    runtime.metrics.of(QuarantineMetrics).quarantines_held.set(held)
    return len(rows)


#: the release loop's lease: one replica revokes what an operator released
LEASE = "quarantine-release"
#: the quarantine's durable consumer (its name)
CONSUMER = "quarantine"


def release_loop(window: timedelta, every: float = 2.0) -> Loop:
    """Now and then, in the replica holding its lease: revoke what an operator released,
    lift the session holds of what one dismissed, say how many wait, record as of when the
    quarantine has applied its Hellos (`watermarks`), and say the fleet's proofs
    (`proofs`). Outages are waited out as every leased loop's are."""

    async def loop(runtime: Runtime, stopping: asyncio.Event) -> None:
        watch = proofs.ProofWatch()

        async def body(lease: leases.Lease) -> None:
            if await revoke_released(runtime, lease, window):
                runtime.wake_outbox()
            await watch.look(runtime)  # the fleet's proofs, said loudly below `require`
            # for the replay worker's hold bound: a quarantine behind its Hellos is late,
            # not down (workers/replay/holds.py)
            await watermarks.record(runtime.pool, runtime.js, runtime.subjects, CONSUMER, "hello")

        await leases.run_leased(
            runtime.pool,
            LEASE,
            runtime.instance,
            body,
            period=every,
            ttl=timedelta(seconds=max(10.0, 5 * every)),
            stopping=stopping,
            held=runtime.metrics.lease_held,
        )

    return loop

"""The liveness sweep: the transitions nobody reports, run by the replica holding the
`liveness` lease.

Each sweep is one transaction fenced on the lease epoch: it reads the sweep state,
plans with the pure rules (outage grace), disconnects sessions of lost gateways and
stale sessions with writes fenced on the epoch and gateway it read, records the sweep,
and publishes `node.disconnected` for each transition. Nothing else is touched.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg

from schemas.events import DisconnectReason, NodeDisconnected
from schemas.subjects import Subjects
from workers.liveness.decide import Rules, SweepState, plan_sweep
from workers.runtime import leases
from workers.runtime.outbox import OutboxBatch
from workers.runtime.settings import LivenessSettings
from workers.runtime.worker import Loop, Runtime

log = logging.getLogger(__name__)

LEASE = "liveness"

READ_STATE = (
    "SELECT last_sweep_at, grace_until, compute_now() AS now FROM liveness_sweeps FOR UPDATE"
)
WRITE_STATE = "UPDATE liveness_sweeps SET last_sweep_at = $1, grace_until = $2"

# Candidates are locked in node order, skipping rows a Hello holds right now (the next
# sweep sees them); the write re-checks epoch and gateway as read.
GATEWAY_LOST = """
WITH lost AS (
    SELECT s.node_id, s.session_epoch, s.gateway_id
      FROM gateways g
      JOIN node_sessions s ON s.gateway_id = g.gateway_id
     WHERE g.lease_expires_at < $1
     ORDER BY s.node_id
       FOR UPDATE OF s SKIP LOCKED
)
UPDATE node_sessions s
   SET gateway_id = NULL, disconnected_at = $2, disconnect_reason = 'gateway-lost'
  FROM lost
 WHERE s.node_id = lost.node_id AND s.session_epoch = lost.session_epoch AND s.gateway_id = lost.gateway_id
RETURNING s.node_id, lost.session_epoch, lost.gateway_id
"""

# A session on a gateway whose lease has expired is not aged here: nobody could flush it,
# and the gateway-loss rule (with its grace to move) decides about it.
STALE = """
WITH stale AS (
    SELECT s.node_id, s.session_epoch, s.gateway_id
      FROM node_sessions s
     WHERE s.gateway_id IS NOT NULL AND s.last_seen < $1
       AND NOT EXISTS (SELECT 1 FROM gateways g
                        WHERE g.gateway_id = s.gateway_id AND g.lease_expires_at < $2)
     ORDER BY s.node_id
       FOR UPDATE OF s SKIP LOCKED
)
UPDATE node_sessions s
   SET gateway_id = NULL, disconnected_at = $2, disconnect_reason = 'liveness-timeout'
  FROM stale
 WHERE s.node_id = stale.node_id AND s.session_epoch = stale.session_epoch AND s.gateway_id = stale.gateway_id
RETURNING s.node_id, stale.session_epoch, stale.gateway_id
"""


@dataclass(frozen=True)
class SweepResult:
    age_transitions: bool
    gateway_lost: int
    stale: int


def rules_of(settings: LivenessSettings) -> Rules:
    return Rules(
        stale_after=settings.stale_after,
        gateway_grace=settings.gateway_grace,
        outage_threshold=settings.outage_threshold,
        outage_grace=settings.outage_grace,
    )


async def sweep_once(
    pool: asyncpg.Pool, lease: leases.Lease | None, subjects: Subjects, rules: Rules
) -> SweepResult:
    """One sweep in one transaction; `LeaseLost` when `lease` is no longer current."""
    async with pool.acquire() as conn, conn.transaction():
        if lease is not None:
            await leases.fence(conn, lease)
        state = await conn.fetchrow(READ_STATE)
        plan = plan_sweep(
            SweepState(state["last_sweep_at"], state["grace_until"]), state["now"], rules
        )
        lost: list[asyncpg.Record] = []
        stale: list[asyncpg.Record] = []
        if plan.age_transitions:
            lost = await conn.fetch(GATEWAY_LOST, plan.gateway_expired_before, state["now"])
            stale = await conn.fetch(STALE, plan.stale_before, state["now"])
        await conn.execute(WRITE_STATE, plan.state.last_sweep_at, plan.state.grace_until)
        outbox = OutboxBatch()
        _announce(outbox, subjects, lost, "gateway-lost")
        _announce(outbox, subjects, stale, "liveness-timeout")
        await outbox.write(conn)
    if lost or stale:
        log.info("sweep: %d gateway-lost, %d liveness-timeout", len(lost), len(stale))
    return SweepResult(plan.age_transitions, len(lost), len(stale))


def _announce(
    outbox: OutboxBatch, subjects: Subjects, rows: list[asyncpg.Record], reason: DisconnectReason
) -> None:
    for row in rows:
        event = NodeDisconnected(
            node_id=row["node_id"],
            epoch=row["session_epoch"],
            gateway_id=row["gateway_id"],
            reason=reason,
        )
        outbox.add(event, subjects.event(event.BC_TYPE), order_key=row["node_id"])


def sweep_loop(settings: LivenessSettings) -> Loop:
    rules = rules_of(settings)

    async def sweep(runtime: Runtime, stopping: asyncio.Event) -> None:
        async def body(lease: leases.Lease) -> None:
            result = await sweep_once(runtime.pool, lease, runtime.subjects, rules)
            if result.gateway_lost or result.stale:
                runtime.wake_outbox()

        await leases.run_leased(
            runtime.pool,
            LEASE,
            runtime.instance,
            body,
            period=settings.sweep_interval,
            ttl=settings.lease_ttl,
            stopping=stopping,
        )

    return sweep

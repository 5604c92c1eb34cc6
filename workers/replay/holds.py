"""The bound on a duplicate-identity hold. Called by the dispatch loop, in the replica
holding its lease.

A Hello whose previous session was live from another boot is held by the Hello
transaction (`held_epoch`): its session gets no command until the quarantine has counted
it. With the quarantine worker down, that would last without bound. Here a session held
`BCW_QUARANTINE_HOLD_MAX` (5 min) after it connected is released — with a WARNING, a
`security.node.hold-expired` event and `bcw_quarantine_holds_expired_total` — and gets
what waits for it, unless the quarantine is only behind: alive and moving (its
watermark, `consumer_watermarks`, said so and moved within the bound) and not yet past
the Hello in the bus. A worker behind its facts never reads as one that is down; one
behind for three times the bound (a flood it works through, a replica stuck with a batch
in hand) lets the session go all the same. The quarantine still counts its Hello when it
gets to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from schemas.events import HoldExpired
from schemas.subjects import Subjects
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.store import leases

log = logging.getLogger(__name__)

CONSUMER = "replay"

#: how long after its Hello transaction a gateway may take to publish the Hello's fact:
#: a quarantine that has applied what the bus stored up to then is past the Hello
PUBLISHED_WITHIN = timedelta(seconds=10)

# Rows locked in node order, skipping those a Hello or a dispatch round holds right now
# (the next look gets them). Never a session the quarantine judged (quarantined, or its
# revocation held for an operator: `alternations_judged_epoch` at or past the hold), nor
# a takeover attempt (an unproven session of a node that proves its Hellos: held for
# good, not for the quarantine), nor one whose certificate is revoked: the bound is for a quarantine worker that is down,
# not one that decided — nor one that is behind: it said, and moved, within the bound,
# and the oldest Hello it has not applied was stored before this one could have been
# ($3), unless the session was held three times the bound already.
RELEASE = """
WITH expired AS (
    SELECT s.node_id FROM node_sessions s
     WHERE s.held_epoch IS NOT NULL AND s.connected_at <= compute_now() - $1::interval
       AND (s.alternations_judged_epoch IS NULL OR s.alternations_judged_epoch < s.held_epoch)
       AND s.proven IS DISTINCT FROM false
       AND NOT EXISTS (SELECT 1 FROM node_certs c
                        WHERE c.serial = s.cert_serial AND c.revoked_at IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM consumer_watermarks w
                        WHERE w.consumer = 'quarantine'
                          AND w.reported_at > compute_now() - $1::interval
                          AND w.moved_at > compute_now() - $1::interval
                          AND w.applied_through < s.connected_at + $3::interval
                          AND s.connected_at > compute_now() - 3 * $1::interval)
     ORDER BY s.node_id
     LIMIT $2
       FOR UPDATE OF s SKIP LOCKED
)
UPDATE node_sessions s SET held_epoch = NULL
  FROM expired e
 WHERE s.node_id = e.node_id
RETURNING s.node_id, s.session_epoch, s.gateway_id,
          extract(epoch FROM compute_now() - s.connected_at)::float8 AS held_seconds
"""


@dataclass(frozen=True)
class Released:
    node_id: str
    epoch: int
    gateway_id: str | None
    held_seconds: float


async def release_expired_holds(
    pool: asyncpg.Pool,
    lease: leases.Lease | None,
    subjects: Subjects,
    hold_max: timedelta,
    limit: int,
) -> list[Released]:
    """Release the sessions held longer than `hold_max`, each with its event."""
    async with pool.acquire() as conn, conn.transaction():
        if lease is not None:
            await leases.fence(conn, lease)
        released = [
            Released(r["node_id"], r["session_epoch"], r["gateway_id"], max(0.0, r["held_seconds"]))
            for r in await conn.fetch(RELEASE, hold_max, limit, PUBLISHED_WITHIN)
        ]
        if not released:
            return []
        outbox = OutboxBatch(CONSUMER)
        for one in released:
            event = HoldExpired(
                node_id=one.node_id,
                epoch=one.epoch,
                gateway_id=one.gateway_id,
                held_seconds=round(one.held_seconds, 3),
            )
            outbox.add(event, subjects.event(event.BC_TYPE))
        await outbox.write(conn)
    for one in released:
        log.warning(
            "released %s (epoch %d) held %.0f s for the quarantine, over BCW_QUARANTINE_HOLD_MAX: "
            "is the quarantine worker running?",
            one.node_id,
            one.epoch,
            one.held_seconds,
        )
    return released

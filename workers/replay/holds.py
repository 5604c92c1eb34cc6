"""The bound on a duplicate-identity hold. Called by the dispatch loop, in the replica
holding its lease.

A Hello whose previous session was live from another boot is held by the Hello
transaction (`held_epoch`): its session gets no command until the quarantine has counted
it. With the quarantine worker down, that would last without bound. Here a session held
`BCW_QUARANTINE_HOLD_MAX` (5 min) after it connected is released — with a WARNING, a
`security.node.hold-expired` event and `bcw_quarantine_holds_expired_total` — and gets
what waits for it, only when the quarantine is down: it said nothing, or did not move,
for that long (its watermark, `consumer_watermarks`). A quarantine alive and moving
keeps the hold: behind the Hello in the bus, for three times the bound at most (a flood
it works through, a replica stuck with a batch in hand; then the session goes all the
same); past it, for good — the quarantine read the bus past the time the Hello's fact
was due and never had it (its gateway withheld it, or published it where the quarantine
does not read): such a session gets nothing, and the node's next Hello (its honest
daemon's, through a gateway that says it) ends the hold. The quarantine counts such a
Hello from its record when it counts the node's next one (`workers.quarantine.record`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg
from prometheus_client.registry import CollectorRegistry

from schemas.events import HoldExpired
from schemas.subjects import Subjects
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.observability.metrics import Counter, MetricSet
from workers.runtime.store import leases

log = logging.getLogger(__name__)


class HoldMetrics(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.holds_expired = Counter(
            registry,
            "bcw_quarantine_holds_expired_total",
            "Sessions held for the quarantine that were released after BCW_QUARANTINE_HOLD_MAX.",
        )


CONSUMER = "replay"

#: how long after its Hello transaction a gateway may take to publish the Hello's fact:
#: a quarantine that has applied what the bus stored up to then is past the Hello
PUBLISHED_WITHIN = timedelta(seconds=10)

# Rows locked in node order, skipping those a Hello or a dispatch round holds right now
# (the next look gets them). Never a session the quarantine judged (quarantined, or its
# revocation held for an operator: `alternations_judged_epoch` at or past the hold), nor
# a takeover attempt (an unproven session of a node that proves its Hellos: held for
# good, not for the quarantine), nor one whose certificate is revoked: the bound is for
# a quarantine worker that is down, not one that decided — nor while the quarantine is
# alive (it said, and moved, within the bound): past the time the Hello's fact was due
# ($3) it never had the fact, and the session stays held; behind it, it is late, for
# three times the bound at most (and never less than the bound past that time).
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
                          AND (w.applied_through >= s.connected_at + $3::interval
                               OR s.connected_at > compute_now()
                                                   - greatest(3 * $1::interval, $3::interval + $1::interval)))
     ORDER BY s.node_id
     LIMIT $2
       FOR UPDATE OF s SKIP LOCKED
)
UPDATE node_sessions s SET held_epoch = NULL
  FROM expired e
 WHERE s.node_id = e.node_id
RETURNING s.node_id, s.session_epoch, s.gateway_id,
          extract(epoch FROM compute_now() - s.connected_at)::float8 AS held_seconds,
          compute_now() AS released_at
"""


@dataclass(frozen=True)
class Released:
    node_id: str
    epoch: int
    gateway_id: str | None
    held_seconds: float
    at: datetime | None = None  # when it was released (the database's clock)


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
            Released(
                r["node_id"],
                r["session_epoch"],
                r["gateway_id"],
                max(0.0, r["held_seconds"]),
                r["released_at"],
            )
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
                at=one.at,
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

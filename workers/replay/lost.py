"""Lost Hellos: a session whose Hello fact never reached the workers is asked of its
gateway again. Called by the dispatch loop, in the replica holding its lease.

JetStream can lose a fact it acknowledged (a power loss with the default
`sync_interval`, docs/durability.md). A lost Hello would leave the session unlabeled,
unannounced and its lanes waiting for a replay that never comes, until the daemon's next
Hello. The replay worker records the epoch of each Hello it applies (`hello_seen`); here,
once its consumer has nothing left to deliver (so the Hello is not merely late), a
connected session without its Hello for `hello_lost_after` gets a `hello-again` notice
to its gateway, which publishes the same fact (same fact id) again: the workers that
had applied it find it in their inbox. The rule is `decide.hello_lost`.
"""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg
from nats.js import JetStreamContext

from schemas.notices import HelloAgain
from schemas.subjects import Subjects
from workers.replay.decide import hello_lost
from workers.runtime.base.rule_settings import ReplaySettings
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.store import leases

log = logging.getLogger(__name__)

CONSUMER = "replay"

# Connected sessions on a gateway whose lease holds (a gone gateway cannot answer; the
# liveness controller's gateway-loss rule is for them) without a Hello seen at their epoch.
CANDIDATES = """
SELECT s.node_id, s.session_epoch, s.gateway_id, s.connected_at, h.seen_epoch, h.asked_epoch,
       h.asked_at, compute_now() AS now
  FROM node_sessions s
  JOIN gateways g ON g.gateway_id = s.gateway_id AND g.lease_expires_at > compute_now()
  LEFT JOIN hello_seen h ON h.node_id = s.node_id
 WHERE s.gateway_id IS NOT NULL AND s.session_epoch > coalesce(h.seen_epoch, 0)
   AND s.connected_at <= compute_now() - $1::interval
 ORDER BY s.node_id
 LIMIT $2
"""

MARK_ASKED = """
INSERT INTO hello_seen (node_id, asked_epoch, asked_at)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[])
ON CONFLICT (node_id) DO UPDATE SET asked_epoch = EXCLUDED.asked_epoch, asked_at = EXCLUDED.asked_at
"""

# what the replay handler records for each current Hello it applied (never backwards)
RECORD_SEEN = """
INSERT INTO hello_seen (node_id, seen_epoch)
SELECT * FROM unnest($1::text[], $2::bigint[])
ON CONFLICT (node_id) DO UPDATE SET seen_epoch = GREATEST(hello_seen.seen_epoch, EXCLUDED.seen_epoch)
"""


async def drained(js: JetStreamContext, subjects: Subjects) -> bool:
    """The replay worker's consumer has delivered every fact and has none unsettled."""
    info = await js.consumer_info(subjects.facts_stream, CONSUMER)
    return not info.num_pending and not info.num_ack_pending


async def ask_for_lost_hellos(
    pool: asyncpg.Pool,
    js: JetStreamContext,
    lease: leases.Lease | None,
    subjects: Subjects,
    settings: ReplaySettings,
) -> int:
    """Ask the gateways for the Hellos the replay worker never saw; how many were asked."""
    if not await drained(js, subjects):
        return 0  # the Hellos may still be on their way
    async with pool.acquire() as conn, conn.transaction():
        if lease is not None:
            await leases.fence(conn, lease)
        rows = await conn.fetch(CANDIDATES, settings.hello_lost_after, settings.nodes_per_round)
        lost = [
            r
            for r in rows
            if hello_lost(
                r["session_epoch"],
                r["seen_epoch"],
                r["connected_at"],
                r["asked_epoch"],
                r["asked_at"],
                r["now"],
                settings.hello_lost_after,
            )
        ]
        if not lost:
            return 0
        outbox = OutboxBatch(CONSUMER)
        for row in lost:
            notice = HelloAgain(node_id=row["node_id"], epoch=row["session_epoch"])
            outbox.add(notice, subjects.notice(row["gateway_id"], notice.BC_TYPE))
        now: datetime = lost[0]["now"]
        await conn.execute(
            MARK_ASKED,
            [r["node_id"] for r in lost],
            [r["session_epoch"] for r in lost],
            [now] * len(lost),
        )
        await outbox.write(conn)
    log.warning(
        "asked the gateways again for %d Hello(s) the workers never saw (e.g. %s at epoch %d)",
        len(lost),
        lost[0]["node_id"],
        lost[0]["session_epoch"],
    )
    return len(lost)

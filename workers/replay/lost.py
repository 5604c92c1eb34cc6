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

The search is incremental (`LostHelloSearch`): a process's first reads every connected
session; each later one only the sessions that became old enough to be lost since the
last complete search, and those whose time to be asked again came since — a fleet at
rest costs it nothing, where reading every session each 10 s was 0.4 cores of
PostgreSQL at a million (`bcw bench rest`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import asyncpg
from nats.js import JetStreamContext

from schemas.notices import HelloAgain
from schemas.subjects import Subjects
from workers.replay.decide import ASK_AGAIN_FACTOR, hello_lost
from workers.replay.settings import ReplaySettings
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.store import leases

log = logging.getLogger(__name__)

CONSUMER = "replay"

# Connected sessions on a gateway whose lease holds (a gone gateway cannot answer; the
# liveness controller's gateway-loss rule is for them) without a Hello seen at their epoch:
# of those that became `hello_lost_after` old since `$3` (connected in the window), or
# whose ask became due again since (asked in the window, `ASK_AGAIN_FACTOR` times as
# long), each found through its own index (migration 0042), not by reading the fleet;
# then each by its key (a session asked again that reconnected since is `hello_lost`'s).
CANDIDATES = """
WITH due AS (
    SELECT s.node_id FROM node_sessions s
     WHERE s.gateway_id IS NOT NULL
       AND s.connected_at > $3::timestamptz - $1::interval
       AND s.connected_at <= compute_now() - $1::interval
    UNION
    SELECT h.node_id FROM hello_seen h
     WHERE h.asked_at IS NOT NULL
       AND h.asked_at > $3::timestamptz - $4::int * $1::interval
       AND h.asked_at <= compute_now() - $4::int * $1::interval
)
SELECT s.node_id, s.session_epoch, s.gateway_id, s.connected_at, h.seen_epoch, h.asked_epoch,
       h.asked_at
  FROM due d
 CROSS JOIN LATERAL (SELECT node_id, session_epoch, gateway_id, connected_at FROM node_sessions
                      WHERE node_id = d.node_id AND gateway_id IS NOT NULL) AS s
  JOIN gateways g ON g.gateway_id = s.gateway_id AND g.lease_expires_at > compute_now()
  LEFT JOIN hello_seen h ON h.node_id = s.node_id
 WHERE s.session_epoch > coalesce(h.seen_epoch, 0)
 ORDER BY s.node_id
 LIMIT $2
"""

#: what a search reads again before the last complete one: more than any Hello
#: transaction's time between its start (its `connected_at`) and its commit
OVERLAP = timedelta(minutes=5)
#: where a process's first search starts: every connected session
SINCE_EVER = datetime(2000, 1, 1, tzinfo=UTC)

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


class LostHelloSearch:
    """The lost-Hello search of one dispatch loop, from where its last complete search left
    off (`since`, less `OVERLAP`). A search that found as many candidates as it may take
    is not complete: the next one starts where it did. A search skipped (the consumer not
    drained) moves nothing. Starting earlier than needed only reads more, so a loop that
    lost its lease and took it again later is still right."""

    def __init__(self) -> None:
        self.since = SINCE_EVER

    async def ask(
        self,
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
            now: datetime = await conn.fetchval("SELECT compute_now()")  # the transaction's
            rows = await conn.fetch(
                CANDIDATES,
                settings.hello_lost_after,
                settings.nodes_per_round,
                self.since,
                ASK_AGAIN_FACTOR,
            )
            asked = await _ask(conn, subjects, rows, settings, now)
        if len(rows) < settings.nodes_per_round:  # complete: the next starts from here
            self.since = now - OVERLAP  # (a clock stepped back moves it back: reads more)
        return asked


async def _ask(
    conn: asyncpg.Connection,
    subjects: Subjects,
    rows: list[asyncpg.Record],
    settings: ReplaySettings,
    now: datetime,
) -> int:
    """Ask for the Hellos of the candidates `rows` that `hello_lost` says are lost, as of
    `now` (the transaction's); how many."""
    lost = [
        r
        for r in rows
        if hello_lost(
            r["session_epoch"],
            r["seen_epoch"],
            r["connected_at"],
            r["asked_epoch"],
            r["asked_at"],
            now,
            settings.hello_lost_after,
        )
    ]
    if not lost:
        return 0
    outbox = OutboxBatch(CONSUMER)
    for row in lost:
        notice = HelloAgain(node_id=row["node_id"], epoch=row["session_epoch"])
        outbox.add(notice, subjects.notice(row["gateway_id"], notice.BC_TYPE))
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

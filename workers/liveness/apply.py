"""The liveness controller's fact handling: Hellos, liveness flushes, closed sessions.

Called by the runtime with one transaction per batch. Every write is fenced on the
session's epoch and gateway; a write that matches nothing is a stale fact, not an error.
How a flush keeps each session's last sight, and the order of the locks every step takes:
`workers.liveness.lastsight`.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from schemas.events import NodeDisconnected
from schemas.facts import (
    CLOSE_CODES,
    Closed,
    Fact,
    Hello,
    Liveness,
    newest_per_node,
)
from schemas.notices import Zombie
from workers.liveness.decide import closes_its_row, connected
from workers.liveness.lastsight.rows import SKIPPED_WAIT as SKIPPED_WAIT  # read here too
from workers.liveness.lastsight.seam import LastSight
from workers.liveness.ranges import credits_json as credits_json  # read here too
from workers.liveness.ranges import node_load_json as node_load_json  # read here too
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Handler, Tx

log = logging.getLogger(__name__)

CURRENT_EPOCHS = """
SELECT s.node_id, s.session_epoch
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT node_id, session_epoch FROM node_sessions WHERE node_id = n.node_id) AS s
"""

# Fenced on node, epoch and gateway; rows locked in node order (`locks.LOCK_ORDER`;
# as the flush's: `lastsight.rows.FLUSH`). A session
# its gateway already closed (it writes a normal close at once, `gateway/store.py`: the
# row is at that epoch, routed nowhere, with that reason) is matched too, and left as
# written: the event is still this worker's to publish.
CLOSING = """
SELECT s.node_id, s.session_epoch, s.gateway_id, f.reason, s.gateway_id IS NULL AS written
  FROM node_sessions s
  JOIN unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS f(node_id, epoch, gateway_id, reason)
    ON s.node_id = f.node_id AND s.session_epoch = f.epoch
   AND (s.gateway_id = f.gateway_id
        OR (s.gateway_id IS NULL AND s.disconnected_at IS NOT NULL
            AND s.disconnect_reason = f.reason))
 ORDER BY s.node_id
   FOR UPDATE OF s
"""

# The worker's login may not set a session's gateway: it clears it through its group's
# function (`liveness_disconnect`, its body migration 0050's), by primary key, each at
# the epoch and gateway as read.
DISCONNECT = """
SELECT d AS node_id FROM liveness_disconnect($1::text[], $2::bigint[], $3::text[], $4::text[], $5) AS d
"""


async def disconnect(
    conn: asyncpg.Connection, rows: list[asyncpg.Record], at: datetime | None, reasons: list[str]
) -> list[asyncpg.Record]:
    """Disconnect the sessions of `rows` (locked by the caller: node_id, session_epoch,
    gateway_id) for `reasons`, at `at` (None: now); returns the rows disconnected."""
    if not rows:
        return []
    epochs = [r["session_epoch"] for r in rows]
    gateways = [r["gateway_id"] for r in rows]
    ids = [r["node_id"] for r in rows]
    gone = {r["node_id"] for r in await conn.fetch(DISCONNECT, ids, epochs, gateways, reasons, at)}
    return [r for r in rows if r["node_id"] in gone]


# As of when the controller sees each gateway's flushes: the newest it applied, and the
# newest it applied that named no range (a whole flush: every session), each as the bus
# stored it (`bus_time`, migration 0043) — never as the time applied, so a controller
# behind its facts sees each gateway as of what it has read, and knows it is behind
# (`seeing.sees`; the range rows say the rest: `seeing.covered_at`). In the flush's own
# transaction, written last in the batch, gateways in order (`locks.LOCK_ORDER`).
SEEN = """
INSERT INTO liveness_gateways AS lg (gateway_id, last_flush_at, whole_flush_at)
SELECT f.gateway_id, max(bus_time(f.stored_at)), max(bus_time(f.stored_at)) FILTER (WHERE f.whole)
  FROM unnest($1::text[], $2::timestamptz[], $3::boolean[]) AS f(gateway_id, stored_at, whole)
 GROUP BY f.gateway_id
 ORDER BY f.gateway_id
ON CONFLICT (gateway_id) DO UPDATE
   SET last_flush_at = GREATEST(lg.last_flush_at, EXCLUDED.last_flush_at),
       whole_flush_at = GREATEST(lg.whole_flush_at, EXCLUDED.whole_flush_at)
"""


def wants(fact: Fact) -> bool:
    """A `closed` of a session that no longer owns its row has nothing to do here."""
    return not isinstance(fact, Closed) or closes_its_row(fact)


def make_handler(max_zombie_notices: int, range_sight: bool | str = False) -> Handler:
    """The liveness controller's handler; each gateway gets at most `max_zombie_notices`
    zombie notices per batch of its flushes (a flood of unknown ids earns no row per id:
    the rest are counted and logged, and named again by its next flush). `range_sight`:
    range facts write only the session rows that change (`sight`); "auto" is decided by
    the first batch of flushes. Which way a flush keeps last sight is `LastSight`'s, the
    one seam; the handler's steps lock in `locks.LOCK_ORDER` (range rows, session rows,
    the gateways' sight rows)."""
    last_sight = LastSight(range_sight)

    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
        outcomes: dict[uuid.UUID, Outcome] = {}
        hellos = [f for f in facts if isinstance(f, Hello)]
        if hellos:
            outcomes.update(await _announce(tx, hellos))
        flushes = [f for f in facts if isinstance(f, Liveness)]
        if flushes:
            _notice(tx, flushes, await last_sight.keep(tx, flushes), max_zombie_notices)
        closed = [f for f in facts if isinstance(f, Closed)]
        if closed:
            outcomes.update(await _disconnect(tx, closed))
        if flushes:  # empty ones too: an empty flush is the gateway's heartbeat on the bus
            await tx.conn.execute(
                SEEN,
                [f.gateway_id for f in flushes],
                [tx.stored_at(f) for f in flushes],
                [f.range_start is None for f in flushes],
            )
        return outcomes

    return handle


async def _announce(tx: Tx, hellos: list[Hello]) -> dict[uuid.UUID, Outcome]:
    nodes = sorted({h.node_id for h in hellos})
    epochs = {r["node_id"]: r["session_epoch"] for r in await tx.conn.fetch(CURRENT_EPOCHS, nodes)}
    outcomes: dict[uuid.UUID, Outcome] = {}
    for hello in hellos:
        event = connected(hello, epochs.get(hello.node_id), await tx.fact_time(hello))
        if event is None:
            outcomes[hello.fact_id] = outcome.STALE
            continue
        tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id)
        epochs.pop(hello.node_id)  # announced once, even if the batch held it twice
    return outcomes


def _notice(tx: Tx, flushes: list[Liveness], zombies: list[Any], max_zombie_notices: int) -> None:
    """A zombie notice for each of the `zombies` of `flushes` to its gateway, at most
    `max_zombie_notices` a gateway."""
    cause = {fact.gateway_id: fact for fact in flushes}
    sent: Counter[str] = Counter()
    for row in zombies:
        if sent[row["gateway_id"]] >= max_zombie_notices:
            continue
        sent[row["gateway_id"]] += 1
        notice = Zombie(node_id=row["node_id"], epoch=row["epoch"])
        tx.publish(
            notice,
            tx.subjects.notice(row["gateway_id"], notice.BC_TYPE),
            cause=cause[row["gateway_id"]],
            order_key=row["node_id"],
        )
    held_back = len(zombies) - sum(sent.values())
    if held_back:
        log.warning(
            "zombie notices held back: %d beyond %d per gateway and batch (gateways %s)",
            held_back,
            max_zombie_notices,
            ", ".join(sorted(sent)),
        )


async def _disconnect(tx: Tx, closed: list[Closed]) -> dict[uuid.UUID, Outcome]:
    by_node = newest_per_node(closed)
    newest = [by_node[node] for node in sorted(by_node)]  # rows in node order
    locked = await tx.conn.fetch(
        CLOSING,
        [f.node_id for f in newest],
        [f.epoch for f in newest],
        [f.gateway_id for f in newest],
        [f.reason for f in newest],
    )
    open_ = [r for r in locked if not r["written"]]
    await disconnect(tx.conn, open_, None, [r["reason"] for r in open_])
    matched = {r["node_id"] for r in locked}
    outcomes: dict[uuid.UUID, Outcome] = {}
    for fact in closed:
        # by identity: `in` a list compared every fact with each by value, the batch squared
        if fact.node_id not in matched or by_node[fact.node_id] is not fact:
            outcomes[fact.fact_id] = outcome.STALE  # an old epoch: changes nothing, says nothing
            continue
        event = NodeDisconnected(
            node_id=fact.node_id,
            epoch=fact.epoch,
            gateway_id=fact.gateway_id,
            reason=fact.reason,
            code=fact.code or CLOSE_CODES.get(fact.reason),
            disconnected_at=await tx.fact_time(fact),
        )
        tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=fact, order_key=fact.node_id)
    return outcomes

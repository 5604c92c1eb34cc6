"""The liveness controller's fact handling: Hellos, liveness flushes, closed sessions.

Called by the runtime with one transaction per batch. Every write is fenced on the
session's epoch and gateway; a write that matches nothing is a stale fact, not an error.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
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
    LivenessEntry,
    newest_per_node,
)
from schemas.notices import Zombie
from workers.liveness import sight
from workers.liveness.decide import closes_its_row, connected
from workers.liveness.ranges import credits_json, keep_ranges, node_load_json
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Handler, Tx

log = logging.getLogger(__name__)

CURRENT_EPOCHS = """
SELECT s.node_id, s.session_epoch
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT node_id, session_epoch FROM node_sessions WHERE node_id = n.node_id) AS s
"""

# One statement for every entry of every flush in the batch: last_seen moves only
# forward, to when the bus stored the entry's flush less its age (`bus_time`, migration
# 0043: never the time the flush is applied, so a flush applied late makes nobody look
# fresher than they were), and the daemon's free credits per lane are kept, when the
# entry has them; on rows matching node, epoch and gateway (one entry per node and
# gateway: its newest epoch, its latest sight — folded per gateway, so that one gateway's
# entries, at any epoch, never stand in for another's); every entry that matches no row
# (as it was before this statement) is returned, for a zombie notice to its gateway. The
# rows are locked in node order first (`locked`), as every other writer of
# node_sessions locks them: an UPDATE … FROM would lock them in whatever order its join
# produces, and deadlock with the recorder or the labeler. A row locked elsewhere is
# skipped (SKIP LOCKED) and the chunk redone waiting, in order (`_flush_chunk`): a
# transaction a gateway keeps open on one node's row never holds back the flush of every
# other node. `$8` is each entry's fact (1-based) in `$9`, the facts' stored times.
FLUSH = """
WITH e AS (
    SELECT e.*, bus_time(($9::timestamptz[])[e.fact]) - e.age_ms * interval '1 millisecond' AS seen
      FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::real[],
                  $7::text[], $8::integer[])
        AS e(node_id, epoch, age_ms, gateway_id, credits, load, node_load, fact)
), folded AS (
    SELECT DISTINCT ON (node_id, gateway_id) * FROM e
     ORDER BY node_id, gateway_id, epoch DESC, seen DESC
), locked AS (
    SELECT s.node_id, f.seen, f.credits, f.load, f.node_load
      FROM node_sessions s
      JOIN folded f
        ON s.node_id = f.node_id AND s.session_epoch = f.epoch AND s.gateway_id = f.gateway_id
     ORDER BY s.node_id
       FOR UPDATE OF s {skip}
), seen AS (
    UPDATE node_sessions s
       SET last_seen = GREATEST(s.last_seen, l.seen),
           lane_credits = coalesce(l.credits::jsonb, s.lane_credits),
           load = coalesce(l.load, s.load),
           node_load = coalesce(l.node_load::jsonb, s.node_load)
      FROM locked l
     WHERE s.node_id = l.node_id
)
SELECT z.node_id, z.epoch, z.gateway_id, NULL::bigint AS locked
  FROM (SELECT DISTINCT e.node_id, e.epoch, e.gateway_id
          FROM e
          LEFT JOIN node_sessions s
            ON s.node_id = e.node_id AND s.session_epoch = e.epoch AND s.gateway_id = e.gateway_id
         WHERE s.node_id IS NULL
           -- looked for only when an entry was not locked: every entry distinct and
           -- locked leaves no zombie, and a healthy flush no second lookup per entry
           AND (SELECT count(*) FROM locked) < (SELECT count(*) FROM e)
         ORDER BY e.gateway_id, e.node_id, e.epoch) z
UNION ALL  -- and a last row: how many rows it locked (and moved)
SELECT NULL, NULL, NULL, (SELECT count(*) FROM locked)
"""
FLUSH_SKIPPING = FLUSH.format(skip="SKIP LOCKED")
#: how long the rows a flush skipped are waited for (a worker's own transactions hold a
#: node's row for milliseconds, seconds on a loaded machine; a gateway's open transaction,
#: as long as it likes)
SKIPPED_WAIT = "3s"
#: flush entries per statement, at most (a batch of 10,000-entry flushes is many)
FLUSH_CHUNK = 20_000
FLUSH_WAITING = FLUSH.format(skip="")

# Fenced on node, epoch and gateway; rows locked in node order (see FLUSH). A session
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
# transaction, written last in the batch (after every session row it locks), gateways in
# order: the sweep locks these rows before it locks sessions, and so never waits for a
# flush.
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
    the first batch of flushes (`sight.switched_on`)."""
    decided: list[bool] = []

    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
        outcomes: dict[uuid.UUID, Outcome] = {}
        hellos = [f for f in facts if isinstance(f, Hello)]
        if hellos:
            outcomes.update(await _announce(tx, hellos))
        flushes = [f for f in facts if isinstance(f, Liveness)]
        if flushes:  # range rows before session rows (`ranges`)
            zombies: list[Any] = []
            one_by_one = flushes
            if not decided:
                decided.append(await sight.switched_on(tx.conn, range_sight))
            if decided[0]:
                zombies, one_by_one = await sight.apply(tx, flushes)
            else:
                await keep_ranges(tx, flushes)
            await _flush(tx, flushes, one_by_one, zombies, max_zombie_notices)
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


async def _flush(
    tx: Tx,
    flushes: list[Liveness],
    one_by_one: list[Liveness],
    zombies: list[Any],
    max_zombie_notices: int,
) -> None:
    """Move the session rows of `one_by_one`'s entries; notice the zombies of `flushes`
    (theirs, and `zombies` found already)."""
    # in node order, a statement per `FLUSH_CHUNK` entries: what one statement holds is
    # bounded whatever the flushes carry, and the chunks still lock rows in node order
    entries = sorted(
        ((e, fact) for fact in one_by_one for e in fact.entries),
        key=lambda pair: pair[0]["node_id"],
    )
    for start in range(0, len(entries), FLUSH_CHUNK):
        zombies += await _flush_chunk(tx, entries[start : start + FLUSH_CHUNK], tx.stored_at)
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
            held_back, max_zombie_notices, ", ".join(sorted(sent)),
        )  # fmt: skip


class _Skipped(Exception):
    """The first pass of a flush chunk skipped rows locked elsewhere: undone, to redo."""


async def _flush_chunk(
    tx: Tx,
    entries: list[tuple[LivenessEntry, Liveness]],
    stored_at: Callable[[Liveness], datetime | None],
) -> list[Any]:
    """Apply one chunk of a batch's flush entries; returns its zombies' rows.

    A first pass skips the rows locked elsewhere. When it skipped any, it is undone (its
    savepoint rolled back: its row locks go with it) and the chunk is applied again,
    waiting for every row in node order — waiting for a skipped row while holding rows
    after it would lock out of order and deadlock with any writer that locks in order
    (the dispatch loop, the recorder). The wait is bounded (`SKIPPED_WAIT`); past it, the
    rows that are free are moved without waiting, and the others by their next flush: a
    transaction a gateway keeps open on one node's row holds back that node only."""
    arguments = flush_arguments(entries, stored_at)
    try:
        async with tx.conn.transaction():  # a savepoint
            rows = await tx.conn.fetch(FLUSH_SKIPPING, *arguments)
            zombies, locked = rows[:-1], rows[-1]["locked"]
            # an entry is a zombie's or matched (at most one matched per folded key): fewer
            # locked than entries less zombies is needed for any to have been skipped — so
            # the exact count (`_matched`) is taken only then, never for a healthy flush
            # nor for a flood of unknown nodes
            if locked < len(entries) - len(zombies) and locked < _matched(entries, zombies):
                raise _Skipped
        return list(zombies)
    except _Skipped:
        pass
    try:  # in a savepoint too: a lock not had loses only this pass
        async with tx.conn.transaction():
            await tx.conn.execute(f"SET LOCAL lock_timeout = '{SKIPPED_WAIT}'")
            rows = await tx.conn.fetch(FLUSH_WAITING, *arguments)
            await tx.conn.execute("SET LOCAL lock_timeout TO DEFAULT")
        return list(rows[:-1])
    except asyncpg.LockNotAvailableError:
        log.info("flush: session rows locked elsewhere; their next flush moves them")
    return list((await tx.conn.fetch(FLUSH_SKIPPING, *arguments))[:-1])


def _matched(entries: list[tuple[LivenessEntry, Liveness]], zombies: Sequence[Any]) -> int:
    """How many rows the flush matches: its entries folded as the statement folds them
    (per node and gateway, the newest epoch), less the zombies. Pure."""
    newest: dict[tuple[str, str], int] = {}
    for entry, fact in entries:
        key = (entry["node_id"], fact.gateway_id)
        if entry["epoch"] > newest.get(key, 0):
            newest[key] = entry["epoch"]
    dead = {(z["node_id"], z["gateway_id"], z["epoch"]) for z in zombies}
    return sum(1 for (node, gateway), epoch in newest.items() if (node, gateway, epoch) not in dead)


def flush_arguments(
    entries: list[tuple[LivenessEntry, Liveness]],
    stored_at: Callable[[Liveness], datetime | None] = lambda _fact: None,
) -> list[list[Any]]:
    """The flush statement's nine arrays for `entries` (each with its fact), in their
    order: seven of the entries' fields, each entry's fact (1-based), and when the bus
    stored each fact (`stored_at`; None: not known, taken as now). Pure."""
    credits = [e.get("credits") for e, _ in entries]
    loads = [e.get("node_load") for e, _ in entries]
    numbers: dict[int, int] = {}  # a fact's place in `stored`, from 1
    stored: list[datetime | None] = []
    for _, fact in entries:
        if id(fact) not in numbers:
            numbers[id(fact)] = len(stored) + 1
            stored.append(stored_at(fact))
    return [
        [e["node_id"] for e, _ in entries],
        [e["epoch"] for e, _ in entries],
        [e["age_ms"] for e, _ in entries],
        [fact.gateway_id for _, fact in entries],
        [credits_json(c) if c is not None else None for c in credits],
        [e.get("load") for e, _ in entries],
        [node_load_json(load) if load else None for load in loads],
        [numbers[id(fact)] for _, fact in entries],
        stored,
    ]


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
        if fact.node_id not in matched or fact not in newest:
            outcomes[fact.fact_id] = outcome.STALE  # an old epoch: changes nothing, says nothing
            continue
        event = NodeDisconnected(
            node_id=fact.node_id, epoch=fact.epoch, gateway_id=fact.gateway_id, reason=fact.reason,
            code=fact.code or CLOSE_CODES.get(fact.reason), disconnected_at=await tx.fact_time(fact),
        )  # fmt: skip
        tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=fact, order_key=fact.node_id)
    return outcomes

"""The row-per-session flush: every entry of a flush moves its session's row (`last_seen`,
credits, load), fenced on node, epoch and gateway; an entry that matches no row is a
zombie's. The way every flush kept a session's last sight before range sight, and still
the way of a flush that names no range (`workers.liveness.lastsight.seam`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from schemas.facts import Liveness, LivenessEntry
from workers.liveness.ranges import credits_json, node_load_json
from workers.runtime.effects.worker import Tx

log = logging.getLogger(__name__)

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
#: as long as it likes; named in BCW_DATABASE_LOCK_TIMEOUT's description)
SKIPPED_WAIT = "3s"
#: flush entries per statement, at most (a batch of 10,000-entry flushes is many)
FLUSH_CHUNK = 20_000
FLUSH_WAITING = FLUSH.format(skip="")


async def move(tx: Tx, flushes: Sequence[Liveness]) -> list[Any]:
    """Move the session rows of the entries of `flushes`; returns the zombies' rows
    (node_id, epoch, gateway_id)."""
    # in node order, a statement per `FLUSH_CHUNK` entries: what one statement holds is
    # bounded whatever the flushes carry, and the chunks still lock rows in node order
    zombies: list[Any] = []
    entries = sorted(
        ((e, fact) for fact in flushes for e in fact.entries),
        key=lambda pair: pair[0]["node_id"],
    )
    for start in range(0, len(entries), FLUSH_CHUNK):
        zombies += await _flush_chunk(tx, entries[start : start + FLUSH_CHUNK], tx.stored_at)
    return zombies


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
            # the exact count (`matched`) is taken only then, never for a healthy flush
            # nor for a flood of unknown nodes
            if locked < len(entries) - len(zombies) and locked < matched(entries, zombies):
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


def matched(entries: list[tuple[LivenessEntry, Liveness]], zombies: Sequence[Any]) -> int:
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

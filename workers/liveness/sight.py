"""A range fact's sight without a row per session (`BCW_LIVENESS_RANGE_SIGHT`; migration
0039): the third step of the flush as rows of hash ranges (docs/capacity.md).

A fact that names a range of node hashes is its gateway's whole set of sessions in it.
Its range row (`workers.liveness.ranges`) is then the sight of every session it names
that is *ranged* (`ranged_epoch = session_epoch`); only the sessions whose standing
changes are written, each once:

- a session the fact names that is not ranged yet (a new epoch, or one its gateway took
  back): ranged, its `last_seen` moved to this sight;
- a ranged session of the range (or of a row it replaces) the fact no longer names:
  unranged, its `last_seen` moved to its sight in the row that named it — never later;
- a named session whose credits differ from those its row last kept: its credits (an
  entry without credits keeps the last known ones; the next entry with some is written
  once, its row having kept none to compare with).

Every other named session costs no write. An entry no session of the gateway matches at
its node and epoch, within the fact's range, is a zombie (a notice, as ever). A fact
older than a row its range overlaps writes nothing. Which sessions a fact speaks for is
read from an index alone (`node_sessions_by_gateway_hash`).

Locks as every flush takes them (`workers.liveness.lastsight.locks.LOCK_ORDER`): range
rows, then session rows (one statement for the batch); the handler then takes the
gateways' sight rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import asyncpg

from schemas.facts import Liveness, LivenessEntry
from workers.liveness.decide import newest_ranges, range_sight_on, replaces
from workers.liveness.ranges import credits_json, node_load_json, sequenced, write_rows
from workers.runtime.base.release import release
from workers.runtime.effects.worker import Tx
from workers.runtime.store.migrate import read_ledger

log = logging.getLogger(__name__)


async def switched_on(conn: asyncpg.Connection, setting: bool | str) -> bool:
    """`BCW_LIVENESS_RANGE_SIGHT` decided (`decide.range_sight_on`: "auto" reads which
    release applied which migration), and said once at INFO."""
    ledger = {} if isinstance(setting, bool) else await read_ledger(conn)  # every row
    on, why = range_sight_on(
        setting, {n: _text(r["release"]) for n, r in ledger.items()}, release()
    )
    log.info("range sight %s: %s", "on" if on else "off", why)
    return on


def _text(value: object) -> str | None:
    return None if value is None else str(value)


# The rows each kept fact's range overlaps, of any age, locked in order.
OVERLAPPED = """
SELECT f.i, o.range_start, o.range_end, o.stream_seq, o.stored_at, o.applied_at,
       o.entries::text AS entries
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY
       AS f(gateway_id, range_start, range_end, i)
  JOIN liveness_ranges o ON o.gateway_id = f.gateway_id
   AND o.range_start < f.range_end AND o.range_end > f.range_start
 ORDER BY o.gateway_id, o.range_start
   FOR UPDATE OF o
"""

# The gateway's sessions in `[$2, $3)` (the fact's range and the rows it replaces), from
# the index alone, against the fact's entries (within its range `[$4, $5)`): named and
# not ranged yet; ranged and no longer named; entries that match none (zombies).
SET_CHECK = """
WITH e AS (SELECT * FROM unnest($6::text[], $7::bigint[]) AS e(node_id, epoch)),
s AS (SELECT node_id, session_epoch, ranged_epoch, node_hash(node_id) AS h FROM node_sessions
       WHERE gateway_id = $1 AND node_hash(node_id) >= $2 AND node_hash(node_id) < $3),
named AS (SELECT s.* FROM s JOIN e ON e.node_id = s.node_id AND e.epoch = s.session_epoch
           WHERE s.h >= $4 AND s.h < $5)
SELECT 'named' AS kind, node_id, session_epoch AS epoch, h FROM named
 WHERE ranged_epoch IS DISTINCT FROM session_epoch
UNION ALL
SELECT 'left', * FROM (  -- a set difference (hashed), not a join: a CTE's row estimates
    SELECT node_id, session_epoch, h FROM s WHERE ranged_epoch = session_epoch
    EXCEPT  -- are guesses, and a nested loop over two ranges' sessions costs 16 ms
    SELECT node_id, session_epoch, h FROM named) AS gone
UNION ALL
SELECT 'zombie', e.node_id, e.epoch, NULL FROM e
 WHERE NOT EXISTS (SELECT 1 FROM named n WHERE n.node_id = e.node_id AND n.session_epoch = e.epoch)
"""

# The batch's session writes, locked in node order, each at its epoch and gateway.
WRITE_SESSIONS = """
WITH w AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::boolean[], $5::bigint[],
                         $6::timestamptz[], $7::text[], $8::real[], $9::text[], $10::timestamptz[])
        AS w(node_id, epoch, gateway_id, ranged, age_ms, seen_at, credits, load, node_load, stored_at)
), locked AS (
    SELECT s.node_id, w.ranged, w.age_ms, w.seen_at, w.credits, w.load, w.node_load, w.stored_at
      FROM node_sessions s
      JOIN w ON s.node_id = w.node_id AND s.session_epoch = w.epoch AND s.gateway_id = w.gateway_id
     ORDER BY s.node_id
       FOR UPDATE OF s
)
UPDATE node_sessions s
   SET ranged_epoch = CASE WHEN l.ranged IS NULL THEN s.ranged_epoch
                           WHEN l.ranged THEN s.session_epoch END,
       last_seen = GREATEST(s.last_seen,
                            coalesce(bus_time(l.stored_at) - l.age_ms * interval '1 millisecond',
                                     l.seen_at)),
       lane_credits = coalesce(l.credits::jsonb, s.lane_credits),
       load = coalesce(l.load, s.load),
       node_load = coalesce(l.node_load::jsonb, s.node_load)
  FROM locked l
 WHERE s.node_id = l.node_id
"""


class Write(NamedTuple):
    """One session row's write: ranged (True), unranged (False) or neither (None); its
    sight as an age at the time the bus stored its fact (`stored_at`, `bus_time`) or as a
    time; its credits and heartbeat load (JSON) to keep."""

    node_id: str
    epoch: int
    gateway_id: str
    ranged: bool | None = None
    age_ms: int | None = None
    seen_at: datetime | None = None
    credits: str | None = None
    load: float | None = None
    node_load: str | None = None
    stored_at: datetime | None = None


def _written(
    entry: LivenessEntry,
    gateway: str,
    ranged: bool | None,
    age: int | None,
    stored: datetime | None,
) -> Write:
    """A write of what `entry` says: its sight (`age` at `stored`), credits and load."""
    credits, node_load = entry.get("credits"), entry.get("node_load")
    return Write(
        entry["node_id"],
        entry["epoch"],
        gateway,
        ranged,
        age,
        credits=credits_json(credits) if credits is not None else None,
        load=entry.get("load"),
        node_load=node_load_json(node_load) if node_load else None,
        stored_at=stored,
    )


class Old(NamedTuple):
    """A range row a fact replaces."""

    range_start: int
    range_end: int
    stream_seq: int
    stored_at: datetime | None
    applied_at: datetime
    entries: str


async def apply(tx: Tx, flushes: list[Liveness]) -> tuple[list[dict[str, Any]], list[Liveness]]:
    """Apply the batch's range facts without a row per session; returns their zombies
    (node_id, epoch, gateway_id) and the facts whose entries still go to session rows
    one by one (those without a range, and range facts with no stream sequence)."""
    ranged, plain = sequenced(tx, flushes)
    kept = newest_ranges(ranged)
    if not kept:
        return [], plain
    keys = [[f.gateway_id for f, _ in kept], [f.range_start for f, _ in kept]]
    keys.append([f.range_end for f, _ in kept])
    overlapped: dict[int, list[Old]] = {}
    for row in await tx.conn.fetch(OVERLAPPED, *keys):
        overlapped.setdefault(row["i"] - 1, []).append(Old(*list(row.values())[1:]))
    accepted = [
        (i, fact, seq)
        for i, (fact, seq) in enumerate(kept)
        if all(
            replaces(seq, tx.stored_at(fact), old.stream_seq, old.stored_at)
            for old in overlapped.get(i, [])
        )
    ]
    zombies: list[dict[str, Any]] = []
    writes: list[Write] = []
    for i, fact, _ in accepted:
        olds = overlapped.get(i, [])
        assert fact.range_start is not None and fact.range_end is not None
        start = min([fact.range_start, *(o.range_start for o in olds)])
        end = max([fact.range_end, *(o.range_end for o in olds)])
        found = await tx.conn.fetch(
            SET_CHECK,
            fact.gateway_id,
            start,
            end,
            fact.range_start,
            fact.range_end,
            [e["node_id"] for e in fact.entries],
            [e["epoch"] for e in fact.entries],
        )
        others = [f for _, f, _ in accepted if f is not fact and f.gateway_id == fact.gateway_id]
        found = [r for r in found if r["kind"] != "left" or not _judged_by(r["h"], others)]
        zombies += [
            {"node_id": r["node_id"], "epoch": r["epoch"], "gateway_id": fact.gateway_id}
            for r in found
            if r["kind"] == "zombie"
        ]
        writes += writes_of(fact, found, olds, tx.stored_at(fact))
    if writes:
        writes.sort(key=lambda w: w.node_id)
        await tx.conn.execute(
            WRITE_SESSIONS, *(list(column) for column in zip(*writes, strict=True))
        )
    await write_rows(tx, [(fact, seq) for _, fact, seq in accepted])
    return zombies, plain


def _judged_by(h: int, others: Sequence[Liveness]) -> bool:
    """Whether another fact of the batch covers hash `h`: it judges that session."""
    return any(f.range_start <= h < f.range_end for f in others)  # type: ignore[operator]


def writes_of(
    fact: Liveness, found: Sequence[Any], olds: Sequence[Old], stored: datetime | None = None
) -> list[Write]:
    """The session writes of one range fact (stored by the bus at `stored`): from its set
    check's rows (`kind`, node_id, epoch) and the rows it replaces. Pure."""
    entries = {e["node_id"]: e for e in fact.entries}
    gateway = fact.gateway_id
    writes: list[Write] = []
    for row in found:
        if row["kind"] == "named":
            entry = entries[row["node_id"]]
            writes.append(_written(entry, gateway, True, entry["age_ms"], stored))
    newly = {w.node_id for w in writes}
    leaving = [r for r in found if r["kind"] == "left"]
    with_credits = [e for e in fact.entries if e.get("credits") is not None]
    if not leaving and not with_credits:
        return writes
    seen, kept_credits = sightings_of(olds)
    for row in leaving:
        key = (row["node_id"], row["epoch"])
        writes.append(Write(row["node_id"], row["epoch"], gateway, False, seen_at=seen.get(key)))
    for entry in with_credits:
        key = (entry["node_id"], entry["epoch"])
        credits = entry.get("credits")
        # compared with what the row that saw it kept: a ranged session is named by it
        if entry["node_id"] not in newly and key in seen and kept_credits[key] != credits:
            writes.append(_written(entry, gateway, None, None, None))
    return writes


def sightings_of(
    olds: Sequence[Old],
) -> tuple[dict[tuple[str, int], datetime], dict[tuple[str, int], Any]]:
    """Per (node, epoch) named by the rows `olds`: its latest sight, and the credits the
    row that saw it last kept. Pure."""
    seen: dict[tuple[str, int], datetime] = {}
    credits: dict[tuple[str, int], Any] = {}
    for old in olds:
        for item in json.loads(old.entries):
            key = (item[0], item[1])
            at = old.applied_at - timedelta(milliseconds=item[2])
            if key not in seen or at > seen[key]:
                seen[key] = at
                credits[key] = item[3] if len(item) > 3 else None
    return seen, credits

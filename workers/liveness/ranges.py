"""The liveness worker's range rows (migration 0037): per gateway and range of node
hashes, the newest liveness fact that named the range, as one row.

A gateway cuts its flush by ranges of node hashes (`workers.gateway.facts.range_cut`), and
a fact naming its range is the gateway's whole set of sessions in it. The worker keeps the
newest such fact of each range — by its sequence in the facts stream, so a fact
redelivered or applied late does not replace a newer one, or, for a stream deleted and
made anew (it numbers from 1), by the stream having stored it more than 10 s after the
row's fact (`decide.replaces`, migration 0040) — as one row: each entry's node, epoch
and age (`sightings`), when the bus stored it (`applied_at`: `bus_time`, migration 0043 —
each entry was seen then less its age, whenever the worker applied it), its oldest
sight. A gateway's rows tile the hash space (a re-cut keeps what it has not named anew:
`REMAINDERS`), and the sweep sees a gateway as of its oldest (`seeing.covered_at`).
Without range sight the
session rows are still written by every flush (`workers.liveness.apply`); with it
(`workers.liveness.sight`) the row is the sight of the sessions it names, read through
`last_sight` (migration 0038) and by the sweep (`STALE_RANGED`) — the flush as rows of
hash ranges (docs/capacity.md, "The design for a million").

A flush locks its range rows first, with range sight or without
(`workers.liveness.lastsight.locks.LOCK_ORDER`), so that replicas of either never lock
the other way round. Only the liveness worker writes range rows. Two replicas that apply facts of two different cuts of one gateway at once may both
keep theirs (no row of one is the other's to replace): the ranges then overlap, until
that gateway's next fact of either replaces both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from json.encoder import encode_basestring
from typing import Any

import asyncpg

from schemas.facts import Liveness, LivenessEntry, NodeLoad
from workers.liveness.decide import newest_ranges, remainders
from workers.runtime.effects.worker import Tx

log = logging.getLogger(__name__)

_OVERLAPS = "{r}.gateway_id = f.gateway_id AND {r}.range_start < f.range_end AND {r}.range_end > f.range_start"
_FACTS = "unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::timestamptz[]) AS f(gateway_id, range_start, range_end, stream_seq, stored_at)"
#: fact `{f}` is newer than row `{r}`: by the stream's sequence, or stored more than 10 s
#: after it (a stream made anew numbers from 1): `range_fact_replaces`, migration 0040;
#: `decide.replaces` in the worker
_REPLACES = "range_fact_replaces({f}.stream_seq, {f}.stored_at, {r}.stream_seq, {r}.stored_at)"

# The rows a fact replaces: of its gateway, overlapping its range, published before it —
# unless a row published after it overlaps it too (the fact is then refused whole: its
# range was re-cut since, and the newer cut holds). Locked in order first.
CLEAR = f"""
DELETE FROM liveness_ranges
 WHERE (gateway_id, range_start) IN (
       SELECT o.gateway_id, o.range_start
         FROM {_FACTS}
         JOIN liveness_ranges o ON {_OVERLAPS.format(r="o")}
        WHERE {_REPLACES.format(f="f", r="o")}
          AND NOT EXISTS (SELECT 1 FROM liveness_ranges n
                           WHERE {_OVERLAPS.format(r="n")} AND NOT {_REPLACES.format(f="f", r="n")})
        ORDER BY o.gateway_id, o.range_start
          FOR UPDATE OF o)
RETURNING gateway_id, range_start, range_end, stream_seq, stored_at, applied_at
"""

# Each fact's row, unless a row overlapping it is as new or newer. A row another replica
# wrote at the same start since `CLEAR` is replaced only by a later fact.
WRITE = """
INSERT INTO liveness_ranges AS r
       (gateway_id, range_start, range_end, stream_seq, stored_at, applied_at, oldest_at,
        sessions, entries)
SELECT f.gateway_id, f.range_start, f.range_end, f.stream_seq, f.stored_at, bus_time(f.stored_at),
       bus_time(f.stored_at) - f.max_age_ms * interval '1 millisecond', f.sessions, f.entries::json
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::timestamptz[],
              $6::bigint[], $7::integer[], $8::text[])
       AS f(gateway_id, range_start, range_end, stream_seq, stored_at, max_age_ms, sessions, entries)
 WHERE NOT EXISTS (SELECT 1 FROM liveness_ranges n
                    WHERE {overlaps} AND NOT {f_replaces_n})
 ORDER BY f.gateway_id, f.range_start
    ON CONFLICT (gateway_id, range_start) DO UPDATE
   SET range_end = EXCLUDED.range_end, stream_seq = EXCLUDED.stream_seq,
       stored_at = EXCLUDED.stored_at, applied_at = EXCLUDED.applied_at,
       oldest_at = EXCLUDED.oldest_at, sessions = EXCLUDED.sessions, entries = EXCLUDED.entries
 WHERE {excluded_replaces_r}
RETURNING gateway_id, range_start, range_end
""".format(
    overlaps=_OVERLAPS.format(r="n"),
    f_replaces_n=_REPLACES.format(f="f", r="n"),
    excluded_replaces_r=_REPLACES.format(f="EXCLUDED", r="r"),
)

# What a re-cut leaves of the rows it replaced. A gateway that cuts its flush anew (its
# sessions grew past what its ranges hold, or fell) replaces rows by facts of other
# bounds, and the facts of the new cut that name the rest may come in a later batch. The
# rest of each replaced row stays, without entries (range sight let its sessions go to
# their own rows: `sight`), at its fact's place in the stream and its time: a gateway's
# rows keep tiling the hash space, and the sweep knows as of when it sees each hash
# (`seeing.covered_at`) — a hash no row covered would hold every session of the gateway.
REMAINDERS = """
INSERT INTO liveness_ranges AS r
       (gateway_id, range_start, range_end, stream_seq, stored_at, applied_at, oldest_at,
        sessions, entries)
SELECT f.gateway_id, f.range_start, f.range_end, f.stream_seq, f.stored_at, f.applied_at,
       f.applied_at, 0, '[]'::json
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::timestamptz[],
              $6::timestamptz[])
       AS f(gateway_id, range_start, range_end, stream_seq, stored_at, applied_at)
 ORDER BY f.gateway_id, f.range_start
    ON CONFLICT (gateway_id, range_start) DO NOTHING
"""

# The ranged sessions the stale rule would take (`sweep.STALE_CANDIDATES` takes the
# others): named at their epoch by a range row of a gateway the controller sees ($3),
# whose lease has not expired ($2), with a sight in it before $1 — read only from the rows
# whose oldest sight is (none, in a healthy fleet), each parsed once. A row a flush is
# replacing right now is skipped: its gateway is flushing. Locked FOR SHARE, so that a
# flush waits for the sweep (never the sweep for a flush) and no row is replaced under
# the sessions the sweep judges by it; `sweep.STALE` reads their last sight once locked.
STALE_RANGED = """
WITH r AS (
    SELECT r.gateway_id, r.applied_at, r.entries FROM liveness_ranges r
     WHERE r.gateway_id = ANY($3::text[]) AND r.oldest_at < $1
       AND NOT EXISTS (SELECT 1 FROM gateways g
                        WHERE g.gateway_id = r.gateway_id AND g.lease_expires_at < $2)
       FOR SHARE SKIP LOCKED
), e AS (
    SELECT r.gateway_id, x ->> 0 AS node_id, (x ->> 1)::bigint AS epoch,
           max(r.applied_at - (x ->> 2)::bigint * interval '1 millisecond') AS seen
      FROM r CROSS JOIN LATERAL json_array_elements(r.entries) AS x
     GROUP BY 1, 2, 3
)
SELECT s.node_id, s.session_epoch, s.gateway_id, greatest(e.seen, s.last_seen) AS sight
  FROM e JOIN node_sessions s
    ON s.node_id = e.node_id AND s.session_epoch = e.epoch AND s.gateway_id = e.gateway_id
 WHERE e.seen < $1 AND s.ranged_epoch = s.session_epoch AND s.last_seen < $1
"""

#: how long a range row no fact replaced is kept once its gateway holds no session: a
#: gateway gone for good (renamed, its pods replaced) leaves its rows behind. The rows
#: of a gateway that still holds sessions stay, however old: they are its sessions' last
#: sight (blind for an hour, its sessions are still judged by them when it is seen again).
RETENTION = timedelta(hours=1)
PRUNE = """
DELETE FROM liveness_ranges r
 WHERE r.applied_at < compute_now() - $1::interval
   AND NOT EXISTS (SELECT 1 FROM node_sessions s WHERE s.gateway_id = r.gateway_id)
"""


def credits_json(credits: Mapping[str, int]) -> str:
    """An entry's free credits per lane as the JSON text the statement casts to `jsonb`.
    Written here rather than by `json.dumps`, which costs four times as much: ~2 µs an
    entry, a tenth of all the worker spends on one. Pure."""
    return "{" + ",".join([f"{encode_basestring(k)}:{v}" for k, v in credits.items()]) + "}"


def node_load_json(load: NodeLoad) -> str:
    """A heartbeat's `NodeLoad` as JSON text, every field of it (a test checks it against
    the type's keys): a third of what `json.dumps` costs. The load average is finite (the
    schema refuses the others), so its `repr` is a JSON number. Pure."""
    return (
        f'{{"load_average":{load["load_average"]!r},'
        f'"memory_available_bytes":{load["memory_available_bytes"]},'
        f'"running_commands":{load["running_commands"]},"pending_events":{load["pending_events"]}}}'
    )


def sightings(entries: Sequence[LivenessEntry]) -> str:
    """A fact's entries as its range row keeps them: JSON text, each `[node_id, epoch,
    age_ms]`, and its credits after them when it has some — what a session's sight is read
    from (`range_sight`, migration 0038), and what its credits are compared with
    (`sight`); the heartbeat's load goes to the session rows. Written here: a fifth of
    the bytes of the entries as they came, and half the time `dump_json` takes. Pure."""
    return "[" + ",".join([_sighting(e) for e in entries]) + "]"


def _sighting(e: LivenessEntry) -> str:
    credits = e.get("credits")
    tail = "]" if credits is None else f",{credits_json(credits)}]"
    return f"[{encode_basestring(e['node_id'])},{e['epoch']},{e['age_ms']}{tail}"


def sequenced(tx: Tx, flushes: list[Liveness]) -> tuple[list[tuple[Liveness, int]], list[Liveness]]:
    """The batch's range facts, each with its stream sequence; and the other flushes
    (without a range, or — applied without the stream — without a sequence)."""
    ranged = [(f, seq) for f in flushes if f.range_start is not None and (seq := tx.sequence(f))]
    taken = {id(f) for f, _ in ranged}
    return ranged, [f for f in flushes if id(f) not in taken]


async def keep_ranges(tx: Tx, flushes: list[Liveness]) -> None:
    """Write the range rows of the batch's range facts (`newest_ranges`)."""
    ranged, others = sequenced(tx, flushes)
    if any(f.range_start is not None for f in others):
        log.debug("range facts without a stream sequence: no range row written for them")
    await write_rows(tx, newest_ranges(ranged))


async def write_rows(tx: Tx, kept: list[tuple[Liveness, int]]) -> None:
    """The range rows of `kept` (range facts, each with its stream sequence, no two of a
    gateway overlapping: `newest_ranges`), each unless a row it overlaps is newer."""
    if not kept:
        return
    keys = [
        [f.gateway_id for f, _ in kept],
        [f.range_start for f, _ in kept],
        [f.range_end for f, _ in kept],
        [seq for _, seq in kept],
        [tx.stored_at(f) for f, _ in kept],
    ]
    replaced = await tx.conn.fetch(CLEAR, *keys)
    written = await tx.conn.fetch(
        WRITE,
        *keys,
        [max((e["age_ms"] for e in f.entries), default=0) for f, _ in kept],
        [len(f.entries) for f, _ in kept],
        [sightings(f.entries) for f, _ in kept],
    )
    bounds = {(w["gateway_id"], w["range_start"], w["range_end"]) for w in written}
    if any((r["gateway_id"], r["range_start"], r["range_end"]) not in bounds for r in replaced):
        await _keep_remainders(tx, replaced, written)


async def _keep_remainders(
    tx: Tx, replaced: Sequence[asyncpg.Record], written: Sequence[asyncpg.Record]
) -> None:
    """The parts of the `replaced` rows no `written` row covers, each kept as a row
    without entries at its replaced row's place and time (`REMAINDERS`)."""
    rows: list[tuple[str, int, int, int, Any, Any]] = []
    for old in replaced:
        mine = [
            (w["range_start"], w["range_end"])
            for w in written
            if w["gateway_id"] == old["gateway_id"]
        ]
        for start, end in remainders([(old["range_start"], old["range_end"])], mine):
            rows.append(
                (
                    old["gateway_id"],
                    start,
                    end,
                    old["stream_seq"],
                    old["stored_at"],
                    old["applied_at"],
                )
            )
    if rows:
        log.debug("range rows re-cut: %d remainder(s) kept until named anew", len(rows))
        await tx.conn.execute(REMAINDERS, *(list(column) for column in zip(*rows, strict=True)))


async def prune(pool: asyncpg.Pool, retention: timedelta = RETENTION) -> int:
    """Delete the range rows no fact replaced for `retention` of gateways that hold no
    session; returns how many. Its own transaction, after a sweep's, that locks range
    rows alone (`lastsight.locks`)."""
    deleted = await pool.execute(PRUNE, retention)
    return int(deleted.split()[-1])

"""The liveness worker's range rows (migration 0037): per gateway and range of node
hashes, the newest liveness fact that named the range, as one row.

A gateway cuts its flush by ranges of node hashes (`workers.gateway.facts.range_cut`), and
a fact naming its range is the gateway's whole set of sessions in it. The worker keeps the
newest such fact of each range — by its sequence in the facts stream, so a fact
redelivered or applied late never replaces a newer one, whatever the clocks say — as one
row: its entries as they came, when it was applied, its oldest sight. The session rows
are still written by every flush (`workers.liveness.apply`), and every reader of
`last_seen` reads them; these rows are the first step of the flush as rows of hash ranges
(docs/capacity.md, "The design for a million").

Lock order: a flush's range rows (in gateway and range order), then its session rows (in
node order), then its gateways' sight rows — the order the step that stops writing
matched sessions needs, taken now so that two releases' replicas never lock the other
way round. Only the liveness worker writes range rows. Two replicas
that apply facts of two different cuts of one gateway at once may both keep theirs (no
row of one is the other's to replace): the ranges then overlap, until that gateway's next
fact of either replaces both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from json.encoder import encode_basestring

import asyncpg

from schemas.facts import Liveness, LivenessEntry
from workers.liveness.decide import newest_ranges
from workers.runtime.effects.worker import Tx

log = logging.getLogger(__name__)

_OVERLAPS = "{r}.gateway_id = f.gateway_id AND {r}.range_start < f.range_end AND {r}.range_end > f.range_start"
_FACTS = "unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS f(gateway_id, range_start, range_end, stream_seq)"

# The rows a fact replaces: of its gateway, overlapping its range, published before it —
# unless a row published after it overlaps it too (the fact is then refused whole: its
# range was re-cut since, and the newer cut holds). Locked in order first.
CLEAR = f"""
DELETE FROM liveness_ranges
 WHERE (gateway_id, range_start) IN (
       SELECT o.gateway_id, o.range_start
         FROM {_FACTS}
         JOIN liveness_ranges o ON {_OVERLAPS.format(r="o")}
        WHERE o.stream_seq < f.stream_seq
          AND NOT EXISTS (SELECT 1 FROM liveness_ranges n
                           WHERE {_OVERLAPS.format(r="n")} AND n.stream_seq > f.stream_seq)
        ORDER BY o.gateway_id, o.range_start
          FOR UPDATE OF o)
"""

# Each fact's row, unless a row overlapping it is as new or newer. A row another replica
# wrote at the same start since `CLEAR` is replaced only by a later fact.
WRITE = """
INSERT INTO liveness_ranges AS r
       (gateway_id, range_start, range_end, stream_seq, applied_at, oldest_at, sessions, entries)
SELECT f.gateway_id, f.range_start, f.range_end, f.stream_seq, compute_now(),
       compute_now() - f.max_age_ms * interval '1 millisecond', f.sessions, f.entries::json
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::integer[],
              $7::text[]) AS f(gateway_id, range_start, range_end, stream_seq, max_age_ms, sessions, entries)
 WHERE NOT EXISTS (SELECT 1 FROM liveness_ranges n
                    WHERE {overlaps} AND n.stream_seq >= f.stream_seq)
 ORDER BY f.gateway_id, f.range_start
    ON CONFLICT (gateway_id, range_start) DO UPDATE
   SET range_end = EXCLUDED.range_end, stream_seq = EXCLUDED.stream_seq,
       applied_at = EXCLUDED.applied_at, oldest_at = EXCLUDED.oldest_at,
       sessions = EXCLUDED.sessions, entries = EXCLUDED.entries
 WHERE r.stream_seq < EXCLUDED.stream_seq
""".format(overlaps=_OVERLAPS.format(r="n"))

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


def sightings(entries: Sequence[LivenessEntry]) -> str:
    """A fact's entries as its range row keeps them: JSON text, each `[node_id, epoch,
    age_ms]` — what a session's sight is read from (`range_sight`, migration 0038); the
    heartbeat's credits and load go to the session rows as before. Written here: a fifth
    of the bytes of the entries as they came, and half the time `dump_json` takes. Pure."""
    return (
        "["
        + ",".join(
            [f"[{encode_basestring(e['node_id'])},{e['epoch']},{e['age_ms']}]" for e in entries]
        )
        + "]"
    )


async def keep_ranges(tx: Tx, flushes: list[Liveness]) -> None:
    """Write the range rows of the batch's range facts (`newest_ranges`)."""
    known = [(f, seq) for f in flushes if f.range_start is not None and (seq := tx.sequence(f))]
    if len(known) < sum(1 for f in flushes if f.range_start is not None):
        log.debug("range facts without a stream sequence: no range row written for them")
    kept = newest_ranges(known)
    if not kept:
        return
    keys = [
        [f.gateway_id for f, _ in kept],
        [f.range_start for f, _ in kept],
        [f.range_end for f, _ in kept],
        [seq for _, seq in kept],
    ]
    await tx.conn.execute(CLEAR, *keys)
    await tx.conn.execute(
        WRITE,
        *keys,
        [max((e["age_ms"] for e in f.entries), default=0) for f, _ in kept],
        [len(f.entries) for f, _ in kept],
        [sightings(f.entries) for f, _ in kept],
    )


async def prune(pool: asyncpg.Pool, retention: timedelta = RETENTION) -> int:
    """Delete the range rows no fact replaced for `retention` of gateways that hold no
    session; returns how many. Its own
    transaction, after a sweep's: the sweep locks sight rows before sessions, a flush
    range rows before sight rows, and this locks range rows alone."""
    deleted = await pool.execute(PRUNE, retention)
    return int(deleted.split()[-1])

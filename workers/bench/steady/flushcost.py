"""`bcw bench flush`: where a liveness flush's cost goes, per entry, at fleet size.

Makes N sessions on G gateways as `bcw bench steady` does, takes one flush of each of
`SAMPLE` gateways as its simulated gateway publishes it (5,000 sessions, bcd's heartbeat
fields), and measures per entry:

- in this process, as a liveness replica spends it: parsing the facts' JSON alone (the
  floor of any validation), decoding them as the consumer does, and building the flush
  statement's arrays;
- in PostgreSQL, the backend's CPU (read from /proc, so the server runs on this
  machine: `--embedded`, or a local one): the flush statement as the liveness worker
  runs it, and the variants a design could take instead (`VARIANTS`), each flush in a
  transaction of its own, committed.

And the parts of one design not built yet, each flush fact a gateway's whole set of
sessions in one range of node-id hashes (`RANGES`): its entries stored as they came, one
row per gateway and range, replacing the last; its set of sessions checked against the
gateway's rows of that range, both ways (zombies, and sessions it no longer holds), by
an index that holds the hash.

Every round runs every part once over the sample, the parts interleaved; a figure is
the median of the rounds. What a million nodes need is ~66,700 entries a second: 15 µs
an entry is a core.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from schemas.facts import Liveness, LivenessEntry
from schemas.registry import REGISTRY
from schemas.subjects import Subjects
from workers.bench.common import bench_target, print_table
from workers.bench.costs import cpu_seconds
from workers.bench.steady import fleet
from workers.liveness.lastsight.rows import FLUSH_SKIPPING, flush_arguments
from workers.runtime.base import heap
from workers.settings import Settings

#: gateways whose flush each part is measured over (5,000 entries each)
SAMPLE = 40
SHARED_BUFFERS = "2GB"

#: the statement as the liveness worker runs it, without its lock pass: an UPDATE … FROM
#: locks rows in the order the join yields them (docs/runtime.md, "Lock order")
NO_LOCK_PASS = """
WITH e AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::real[],
                         $7::text[]) AS e(node_id, epoch, age_ms, gateway_id, credits, load, node_load)
)
UPDATE node_sessions s
   SET last_seen = GREATEST(s.last_seen, compute_now() - e.age_ms * interval '1 millisecond'),
       lane_credits = coalesce(e.credits::jsonb, s.lane_credits),
       load = coalesce(e.load, s.load),
       node_load = coalesce(e.node_load::jsonb, s.node_load)
  FROM e
 WHERE s.node_id = e.node_id AND s.session_epoch = e.epoch AND s.gateway_id = e.gateway_id
"""
LAST_SEEN_ALONE = """
UPDATE node_sessions s
   SET last_seen = GREATEST(s.last_seen, compute_now() - e.age_ms * interval '1 millisecond')
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[]) AS e(node_id, epoch, age_ms, gateway_id)
 WHERE s.node_id = e.node_id AND s.session_epoch = e.epoch AND s.gateway_id = e.gateway_id
"""
ROWS_TABLE = """
CREATE TABLE bench_flush_rows (
    gateway_id text NOT NULL, flushed_at timestamptz NOT NULL,
    node_ids text[] NOT NULL, epochs bigint[] NOT NULL, ages_ms bigint[] NOT NULL
)"""
#: the narrow table of last-seen times beside the session row (what a flush would write
#: instead of the wide row): the key, the fence and the time, with room for HOT updates
NARROW_TABLE = """
CREATE TABLE bench_sight (
    node_id text PRIMARY KEY, session_epoch bigint NOT NULL, gateway_id text,
    last_seen timestamptz NOT NULL
) WITH (fillfactor = 50);
INSERT INTO bench_sight SELECT node_id, session_epoch, gateway_id, last_seen FROM node_sessions"""
NARROW = """
UPDATE bench_sight s
   SET last_seen = GREATEST(s.last_seen, compute_now() - e.age_ms * interval '1 millisecond')
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[]) AS e(node_id, epoch, age_ms, gateway_id)
 WHERE s.node_id = e.node_id AND s.session_epoch = e.epoch AND s.gateway_id = e.gateway_id
"""
ONE_ROW = "INSERT INTO bench_flush_rows VALUES ($4, compute_now(), $1, $2, $3)"
GATEWAY_SESSIONS = "SELECT node_id, session_epoch FROM node_sessions WHERE gateway_id = $1"
ZOMBIE_JOIN = """
SELECT e.node_id
  FROM unnest($1::text[], $2::bigint[], $3::text[]) AS e(node_id, epoch, gateway_id)
  LEFT JOIN node_sessions s
    ON s.node_id = e.node_id AND s.session_epoch = e.epoch AND s.gateway_id = e.gateway_id
 WHERE s.node_id IS NULL
"""

Arguments = list[Any]

#: the range design: a node's place is a hash of its id (md5's first 4 bytes, signed),
#: which the gateway computes as the index does
NODE_HASH = """
CREATE FUNCTION bench_node_hash(text) RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT ('x' || substr(md5($1), 1, 8))::bit(32)::int $$;
CREATE INDEX bench_by_gateway_hash
    ON node_sessions (gateway_id, bench_node_hash(node_id), node_id, session_epoch);
CREATE TABLE bench_flush_ranges (
    gateway_id text NOT NULL, range_start int NOT NULL, range_end int NOT NULL,
    flushed_at timestamptz NOT NULL, entries jsonb NOT NULL,
    PRIMARY KEY (gateway_id, range_start)
);
CREATE TABLE bench_flush_ranges_text (LIKE bench_flush_ranges INCLUDING ALL);
ALTER TABLE bench_flush_ranges_text ALTER COLUMN entries TYPE json"""
#: one row per gateway and range, the entries as they came, the last flush replaced
RANGE_STORE = """
INSERT INTO bench_flush_ranges AS r VALUES ($1, $2, $3, compute_now(), $4::jsonb)
ON CONFLICT (gateway_id, range_start) DO UPDATE
   SET range_end = EXCLUDED.range_end, flushed_at = EXCLUDED.flushed_at, entries = EXCLUDED.entries
"""
#: the same, the entries kept as JSON text (checked, not parsed into jsonb)
RANGE_STORE_TEXT = RANGE_STORE.replace("bench_flush_ranges", "bench_flush_ranges_text").replace(
    "$4::jsonb", "$4::json"
)
#: the flush's sessions against the gateway's rows in its range: the entries no session
#: matches (zombies) and the sessions no entry names (it no longer holds them)
RANGE_CHECK = """
SELECT coalesce(e.node_id, r.node_id) AS node_id, e.node_id IS NULL AS missing
  FROM unnest($1::text[], $2::bigint[]) AS e(node_id, epoch)
  FULL JOIN (SELECT node_id, session_epoch FROM node_sessions
              WHERE gateway_id = $3 AND bench_node_hash(node_id) BETWEEN $4 AND $5) AS r
    ON r.node_id = e.node_id AND r.session_epoch = e.epoch
 WHERE e.node_id IS NULL OR r.node_id IS NULL
"""
#: ranges a gateway's sessions are cut into (5,000 sessions: ~1,250 a fact, as today)
RANGES = 4


def node_hash(node_id: str) -> int:
    """`bench_node_hash` in Python: md5's first 4 bytes, signed. Pure."""
    return int.from_bytes(hashlib.md5(node_id.encode()).digest()[:4], "big", signed=True)


def range_facts(facts: list[Liveness]) -> list[Arguments]:
    """Each gateway's entries in `facts` cut into `RANGES` ranges of node hashes: per
    range, (node ids, epochs, gateway, first hash, last hash, the entries as JSON — the
    heartbeat's fields with them, as they came). Pure."""
    by_gateway: dict[str, list[tuple[int, str, LivenessEntry]]] = {}
    for fact in facts:
        for entry in fact.entries:
            node = entry["node_id"]
            by_gateway.setdefault(fact.gateway_id, []).append((node_hash(node), node, entry))
    width = 2**32 // RANGES
    out: list[Arguments] = []
    for gateway, entries in by_gateway.items():
        for k in range(RANGES):
            lo, hi = -(2**31) + k * width, -(2**31) + (k + 1) * width - 1
            inside = (t for t in entries if lo <= t[0] <= hi)
            mine = [e for _, _, e in sorted(inside, key=lambda t: (t[0], t[1]))]
            text = json.dumps(mine, separators=(",", ":"))
            ids, epochs = [e["node_id"] for e in mine], [e["epoch"] for e in mine]
            out.append([ids, epochs, gateway, lo, hi, text])
    return out


def _range_store(arguments: Arguments) -> Arguments:
    return [arguments[2], arguments[3], arguments[4], arguments[5]]


def _range_check(arguments: Arguments) -> Arguments:
    return arguments[:5]


def _full(arrays: list[list[Any]]) -> Arguments:
    return arrays


def _fields(arrays: list[list[Any]]) -> Arguments:
    return arrays[:7]  # the entries' fields, without their facts' stored times


def _no_heartbeat(arrays: list[list[Any]]) -> Arguments:
    """The arrays without the heartbeat's fields: a flush that only says ages."""
    n = len(arrays[0])
    return [*arrays[:4], [None] * n, [None] * n, [None] * n, *arrays[7:]]


def _ages(arrays: list[list[Any]]) -> Arguments:
    return arrays[:4]  # node ids, epochs, ages, gateway ids


def _one_row(arrays: list[list[Any]]) -> Arguments:
    return [*arrays[:3], arrays[3][0]]


def _gateway(arrays: list[list[Any]]) -> Arguments:
    return [arrays[3][0]]


def _keys(arrays: list[list[Any]]) -> Arguments:
    return [arrays[0], arrays[1], arrays[3]]


@dataclass(frozen=True)
class Variant:
    name: str
    sql: str
    #: the statement's arguments, from the arrays the liveness worker builds for a flush
    arguments: Callable[[list[list[Any]]], Arguments]
    #: run in a savepoint of the flush's transaction, as the worker runs each chunk
    savepoint: bool = False


VARIANTS = (
    Variant("the flush as the worker applies it", FLUSH_SKIPPING, _full, savepoint=True),
    Variant("  the same, not in a savepoint", FLUSH_SKIPPING, _full),
    Variant("  the same, without the heartbeat's fields", FLUSH_SKIPPING, _no_heartbeat),
    Variant("  without its lock pass (UPDATE … FROM)", NO_LOCK_PASS, _fields),
    Variant("  last_seen alone, no lock pass", LAST_SEEN_ALONE, _ages),
    Variant("last_seen in a narrow table of its own", NARROW, _ages),
    Variant("one row per flush (arrays), no session row", ONE_ROW, _one_row),
    Variant("the gateway's sessions, read by index", GATEWAY_SESSIONS, _gateway),
    Variant("the zombie check alone (a join, no write)", ZOMBIE_JOIN, _keys),
)
#: the range design's parts, over `range_facts`
RANGE_VARIANTS = (
    Variant("a range's entries stored as they came (jsonb)", RANGE_STORE, _range_store),
    Variant("  the same as JSON text (json)", RANGE_STORE_TEXT, _range_store),
    Variant("a range's sessions checked both ways (index)", RANGE_CHECK, _range_check),
)


async def _measured(backend: int, entries: int, work: Callable[[], Awaitable[None]]) -> float:
    """µs of the backend's CPU per entry that `work` took (its wall time where /proc
    does not show the backend)."""
    cpu, wall = cpu_seconds(backend), time.monotonic()
    await work()
    spent = cpu_seconds(backend) - cpu
    return (time.monotonic() - wall if math.isnan(spent) else spent) / entries * 1e6


async def _apply(
    conn: asyncpg.Connection, variant: Variant, flushes: list[list[list[Any]]]
) -> None:
    for arrays in flushes:  # a flush's arrays, or a range fact's arguments
        async with conn.transaction():
            if variant.savepoint:
                async with conn.transaction():
                    await conn.fetch(variant.sql, *variant.arguments(arrays))
            else:
                await conn.fetch(variant.sql, *variant.arguments(arrays))


async def _plan(conn: asyncpg.Connection, sql: str, arguments: Arguments) -> str:
    """How `sql` reads `node_sessions`: its scan and, for an index-only one, the heap
    pages it still had to read."""
    [explained] = json.loads(
        await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *arguments)
    )
    found = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "node_sessions":
            fetches = node.get("Heap Fetches")
            found.append(
                node["Node Type"] + ("" if fetches is None else f", heap fetches {fetches}")
            )
        for child in node.get("Plans", []):
            walk(child)

    walk(explained["Plan"])
    return "; ".join(found) or "no scan of node_sessions"


def _in_process(
    bodies: list[bytes],
) -> tuple[float, float, float, list[list[list[Any]]], list[Liveness]]:
    """µs of this process's CPU per entry to parse the flushes' JSON alone (the floor of
    any validation), to decode them as the consumer does and to build their arrays; and
    the arrays (one set per flush, as `_flush` builds them) and the facts."""
    started = time.process_time()
    for body in bodies:
        json.loads(body)
    parsed = time.process_time()
    facts = [REGISTRY.validate(Liveness, body) for body in bodies]
    decoded = time.process_time()
    arguments = [
        flush_arguments(sorted(((e, f) for e in f.entries), key=lambda p: p[0]["node_id"]))
        for f in facts
    ]
    built = time.process_time()
    per_entry = 1e6 / sum(len(f.entries) for f in facts)
    return (
        (parsed - started) * per_entry,
        (decoded - parsed) * per_entry,
        (built - decoded) * per_entry,
        arguments,
        facts,
    )


async def run(settings: Settings, nodes: int, gateways: int, rounds: int, embedded: bool) -> int:
    server = {"shared_buffers": SHARED_BUFFERS}
    async with bench_target(settings, embedded, postgres=server) as target:
        conn = await asyncpg.connect(target.database_url)
        try:
            print(f"making {nodes:,} sessions on {gateways} gateways ...", flush=True)
            await fleet.prepare(conn, nodes, gateways)
            await conn.execute(ROWS_TABLE)
            await conn.execute(NARROW_TABLE)
            await conn.execute(NODE_HASH)
            # the range design writes no session row per flush: its pages stay all-visible
            await conn.execute("VACUUM (ANALYZE) node_sessions, bench_sight")
            await conn.execute("CHECKPOINT")
            subjects = Subjects(target.subject_root)
            sample = [fleet.Gateway(g, nodes, gateways, subjects) for g in range(gateways)]
            sample = sample[:SAMPLE]
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            # as a worker process does once started: the collector leaves what it holds
            # be (here, the simulated gateways' million encoded sessions, which a
            # replica never holds and the collector would walk at every decode)
            heap.settle()
            where = "postgres, wall" if math.isnan(cpu_seconds(backend)) else "postgres"
            figures: dict[str, list[float]] = {}
            for _ in range(rounds):
                bodies = [body for gw in sample for _, body in gw.flush()]
                parse, decode, build, flushes, facts = _in_process(bodies)
                figures.setdefault("parse", []).append(parse)
                figures.setdefault("decode", []).append(decode)
                figures.setdefault("build", []).append(build)
                entries = sum(len(f[0]) for f in flushes)
                # first, as that design runs: no flush has written a session row since
                # the last vacuum, so the check reads the index alone
                await conn.execute("VACUUM node_sessions")
                ranges = range_facts(facts)
                for variant in RANGE_VARIANTS:
                    work = functools.partial(_apply, conn, variant, ranges)
                    spent = await _measured(backend, entries, work)
                    figures.setdefault(variant.name, []).append(spent)
                for variant in VARIANTS:
                    work = functools.partial(_apply, conn, variant, flushes)
                    spent = await _measured(backend, entries, work)
                    figures.setdefault(variant.name, []).append(spent)
            # every gateway flushes every session it holds: the check finds nothing
            wrong = sum([len(await conn.fetch(RANGE_CHECK, *_range_check(r))) for r in ranges])
            await conn.execute("VACUUM node_sessions")
            plan = await _plan(conn, RANGE_CHECK, _range_check(ranges[0]))
        finally:
            await conn.close()
    rows = [
        ("parse the facts' JSON alone (json.loads)", "liveness", figures["parse"]),
        ("decode the flush facts (the consumer)", "liveness", figures["decode"]),
        ("build the statement's arrays", "liveness", figures["build"]),
        *((v.name, where, figures[v.name]) for v in (*VARIANTS, *RANGE_VARIANTS)),
    ]
    print_table(
        f"bcw bench flush: {nodes:,} sessions on {gateways} gateways, {len(sample)} flushes "
        f"a part, median of {rounds} rounds (µs of a core per entry; 15 µs is a core at a "
        "million nodes)",
        ("part", "where", "µs/entry"),
        [(name, place, f"{statistics.median(spent):.2f}") for name, place, spent in rows],
    )
    print(f"the range check reads the sessions by {plan}")
    if wrong:
        print(f"the range check found {wrong} session(s) amiss in a fleet that has none")
        return 1
    return 0

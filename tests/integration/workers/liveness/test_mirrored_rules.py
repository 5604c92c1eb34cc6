"""The liveness rules kept twice, in Python and in SQL, agree on a real PostgreSQL, case by
case (docs/workers.md, "Rules kept in Python and in SQL"): which session rows a flush
matches (`lastsight.rows.matched` and the flush statement's count), and a session's sight
in its gateway's range rows (`sight.sightings_of` and `range_sight`, migration 0038). The
other two pairs, `decide.replaces` and `node_hash`, are tried in test_liveness_ranges.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.facts import HASH_SPACE, Liveness, LivenessEntry, node_hash
from tests.factories import make_fact
from tests.integration import fleet
from workers.liveness.lastsight.rows import FLUSH_SKIPPING, flush_arguments, matched
from workers.liveness.ranges import sightings
from workers.liveness.sight import Old, sightings_of

NODES = [f"n{i}" for i in range(6)]
GATEWAYS = ["gw-a", "gw-b"]
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def flush(gateway: str, entries: list[tuple[str, int, int]]) -> Liveness:
    fact = make_fact(
        "liveness",
        gateway_id=gateway,
        entries=[{"node_id": n, "epoch": e, "age_ms": age} for n, e, age in entries],
    )
    assert isinstance(fact, Liveness)
    return fact


@EXAMPLES
@given(
    sessions=st.dictionaries(
        st.sampled_from(NODES),
        st.tuples(st.integers(1, 3), st.sampled_from([*GATEWAYS, None])),
    ),
    flushes=st.lists(
        st.tuples(
            st.sampled_from(GATEWAYS),
            st.lists(
                st.tuples(st.sampled_from(NODES), st.integers(1, 3), st.integers(0, 5_000)),
                max_size=8,
            ),
        ),
        max_size=4,
    ),
)
async def test_the_flush_statement_locks_the_rows_the_worker_counts_it_matches(
    db: asyncpg.Connection,
    sessions: dict[str, tuple[int, str | None]],
    flushes: list[tuple[str, list[tuple[str, int, int]]]],
) -> None:
    """Folded per node and gateway to the newest epoch, less the zombies: `matched` says
    how many rows the statement locks when none is locked elsewhere, which is how the
    worker knows the statement skipped one (`rows._flush_chunk`)."""
    facts = [flush(gateway, entries) for gateway, entries in flushes]
    pairs = sorted(
        ((e, fact) for fact in facts for e in fact.entries), key=lambda p: p[0]["node_id"]
    )
    done = db.transaction()
    await done.start()
    try:
        for node, (epoch, gateway) in sessions.items():
            await fleet.session(db, node, epoch=epoch, gateway_id=gateway)
        found = await db.fetch(FLUSH_SKIPPING, *flush_arguments(pairs))
        zombies, locked = found[:-1], found[-1]["locked"]
        assert locked == matched(pairs, zombies)
    finally:
        await done.rollback()


@st.composite
def range_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A gateway's range rows (overlapping at times, as two cuts of it may for a moment),
    each naming some of the sessions whose hash it holds, at some epoch and age."""
    rows: list[dict[str, Any]] = []
    starts: set[int] = set()
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.sampled_from([0, *sorted(node_hash(n) for n in NODES)]))
        end = draw(st.sampled_from([HASH_SPACE, *(node_hash(n) + 1 for n in NODES)]))
        if end <= start or start in starts:
            continue
        starts.add(start)
        entries: list[LivenessEntry] = []
        for node in NODES:
            if start <= node_hash(node) < end and draw(st.booleans()):
                entry: dict[str, Any] = {
                    "node_id": node,
                    "epoch": draw(st.integers(1, 2)),
                    "age_ms": draw(st.integers(0, 120_000)),
                }
                if draw(st.booleans()):
                    entry["credits"] = {"default": draw(st.integers(0, 9))}
                entries.append(entry)  # type: ignore[arg-type]
        ago = draw(st.integers(0, 600_000))
        rows.append({"start": start, "end": end, "ago_ms": ago, "entries": entries})
    return rows


@EXAMPLES
@given(rows=range_rows())
async def test_a_sessions_sight_in_the_range_rows_is_the_same_read_by_python_or_sql(
    db: asyncpg.Connection, rows: list[dict[str, Any]]
) -> None:
    """The latest of the rows' times applied less the entry's age, for each node at each
    epoch: what a range fact's check reads in Python for the sessions it lets go, and
    what `range_sight` (and so `last_sight`, `node_last_seen`, the disconnects) reads."""
    done = db.transaction()
    await done.start()
    try:
        for i, row in enumerate(rows, 1):
            await db.execute(
                "INSERT INTO liveness_ranges (gateway_id, range_start, range_end, stream_seq,"
                " stored_at, applied_at, oldest_at, sessions, entries)"
                " SELECT 'gw-a', $1, $2, $3, t, t, t, $4, $5::json"
                " FROM (SELECT now() - $6 * interval '1 millisecond' AS t) AS x",
                row["start"],
                row["end"],
                i,
                len(row["entries"]),
                sightings(row["entries"]),
                row["ago_ms"],
            )
        olds = [
            Old(*r.values())
            for r in await db.fetch(
                "SELECT range_start, range_end, stream_seq, stored_at, applied_at,"
                " entries::text AS entries FROM liveness_ranges WHERE gateway_id = 'gw-a'"
            )
        ]
        seen, _credits = sightings_of(olds)
        for node in NODES:
            for epoch in (1, 2):
                sql = await db.fetchval("SELECT range_sight($1, $2, 'gw-a')", node, epoch)
                assert sql == seen.get((node, epoch)), (node, epoch)
        assert seen.keys() == {(e["node_id"], e["epoch"]) for r in rows for e in r["entries"]}
    finally:
        await done.rollback()


def test_the_pairs_tried_here_are_the_ones_the_docs_name() -> None:
    """docs/workers.md names each pair; a pair added there without a test here fails."""
    page = (Path(__file__).resolve().parents[4] / "docs" / "workers.md").read_text()
    lines = page.split("### Rules kept in Python and in SQL", 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = itertools.takewhile(lambda line: line.startswith("|"), lines[first:])
    named = {line.split("|")[1].strip() for line in table if line.startswith("| `")}
    assert named == {
        "`decide.replaces`",
        "`schemas.facts.node_hash`",
        "`lastsight.rows.matched`",
        "`sight.sightings_of`",
    }, named

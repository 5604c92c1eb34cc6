"""`bcw bench sweep`: one liveness sweep over a large fleet with 1 % stale sessions.

Fills N connected sessions over 20 gateways (bulk SQL), makes 1 % of them stale, and
times `sweep_once` (the leased sweep's transaction: read state and what it sees of each
gateway, count the stale sessions per gateway for the breaker, select and fence-write
the stale sessions of the gateways it sees, queue their `node.disconnected` events).
Three rounds; each round re-stales a fresh 1 %, has every gateway's flush applied just
before (as 20 gateways flushing every 15 s would), and vacuums the table first, as
autovacuum would have between real sweeps.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from datetime import timedelta

import asyncpg

from schemas.subjects import Subjects
from workers.bench.common import bench_target, print_table
from workers.liveness.sweep import rules_of, sweep_once
from workers.settings import Settings

FILL = """
INSERT INTO nodes (node_id, role) SELECT 's' || i, 'worker' FROM generate_series(1, $1) i;
INSERT INTO node_sessions (node_id, role, session_epoch, gateway_id, boot_id, journal_id, connected_at, last_seen)
SELECT 's' || i, 'worker', 1, 'gw-' || (i % 20), 'boot', 'journal', compute_now(), compute_now()
  FROM generate_series(1, $1) i;
ANALYZE nodes; ANALYZE node_sessions;
"""

# every gateway's latest flush was just applied: the sweep sees all 20
SEEN = """
INSERT INTO liveness_gateways (gateway_id, last_flush_at)
SELECT 'gw-' || g, compute_now() FROM generate_series(0, 19) g
ON CONFLICT (gateway_id) DO UPDATE SET last_flush_at = EXCLUDED.last_flush_at
"""

STALE_ROUND = """
UPDATE node_sessions SET last_seen = compute_now() - interval '10 minutes'
 WHERE node_id IN (SELECT 's' || i FROM generate_series($1::int, $2::int) i)
"""


async def run(settings: Settings, nodes: int, embedded: bool, rounds: int = 3) -> int:
    async with bench_target(settings, embedded) as target:
        conn = await asyncpg.connect(target.database_url)
        pool = await asyncpg.create_pool(target.database_url, min_size=1, max_size=2)
        try:
            print(f"filling {nodes:,} connected sessions ...")
            await conn.execute(FILL.replace("$1", str(int(nodes))))
            stale = max(1, nodes // 100)
            # stale after 5 minutes here: filling a million rows may itself take longer
            # than the 45 s default, which would make every session stale at once
            rules = dataclasses.replace(
                rules_of(settings.liveness), stale_after=timedelta(minutes=5)
            )
            subjects = Subjects(target.subject_root)
            timings = []
            for i in range(rounds):
                await conn.execute(STALE_ROUND, i * stale + 1, (i + 1) * stale)
                await conn.execute(
                    "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), grace_until = NULL"
                )
                await conn.execute(SEEN)
                await conn.execute("DELETE FROM outbox; DELETE FROM outbox_packs")
                await conn.execute("VACUUM ANALYZE node_sessions")
                started = time.perf_counter()
                result = await sweep_once(pool, None, subjects, rules)
                timings.append(time.perf_counter() - started)
                assert result.stale == stale, result
                print(
                    f"round {i + 1}/{rounds}: {result.stale:,} stale of {nodes:,} in {timings[-1]:.3f} s"
                )
        finally:
            await pool.close()
            await conn.close()
    print_table(
        f"bcw bench sweep: {nodes:,} sessions, {stale:,} stale (1 %)",
        ("measure", "value"),
        [
            ("sweep (median)", f"{statistics.median(timings):.3f} s"),
            ("sweep (worst)", f"{max(timings):.3f} s"),
            ("transitions/s", f"{stale / statistics.median(timings):,.0f}"),
        ],
    )
    return 0

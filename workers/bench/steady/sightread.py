"""What reading the fleet's last sights costs at the bench's size: `node_last_seen`
(migration 0050, the reader docs/contract.md names for the rest of the control plane),
read whole once and for one node at a time, while the fleet is held — after the last
minute's figures are taken, so that the reads count in none of them."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from workers.bench.steady.figures import percentile

#: the whole fleet: every session's last sight, and how many connected sessions the
#: view says were last seen before the stale threshold (none, in a held fleet once the
#: silenced nodes are gone: each sight is within a flush period of its gateway's last)
WHOLE = """
SELECT count(*) AS sessions,
       count(*) FILTER (WHERE gateway_id IS NOT NULL AND last_seen < $1) AS stale
  FROM node_last_seen
"""
ONE = "SELECT session_epoch, gateway_id, last_seen FROM node_last_seen WHERE node_id = $1"
#: one-node lookups timed, each a node of the fleet picked at random
LOOKUPS = 50


@dataclass(frozen=True)
class SightRead:
    """How long reading last sights took."""

    whole: float  # seconds to read every session's
    sessions: int  # rows the whole read gave
    stale: int  # connected sessions it said last seen before the stale threshold
    one: tuple[float, ...]  # seconds of each one-node lookup

    def line(self) -> str:
        return (
            f"last sight read (node_last_seen): whole fleet {self.whole:.2f} s ({self.sessions:,} "
            f"sessions, {self.stale:,} connected seen before the stale threshold), one node p50 "
            f"{1000 * percentile(self.one, 0.5):.2f} ms max "
            f"{1000 * max(self.one, default=math.nan):.2f} ms ({len(self.one)} lookups)"
        )


async def measure(conn: asyncpg.Connection, nodes: int, stale_after: timedelta) -> SightRead:
    """Read the whole fleet's last sights once, then `LOOKUPS` single nodes (`node-<i>`,
    as `fleet.prepare` names them), each timed on its own."""
    threshold = await conn.fetchval("SELECT compute_now() - $1::interval", stale_after)
    started = time.perf_counter()
    whole = await conn.fetchrow(WHOLE, threshold)
    took = time.perf_counter() - started
    one = await conn.prepare(ONE)
    await one.fetchrow("node-1")  # planned once, as a reader's prepared statement is
    lookups = []
    for i in random.Random(nodes).sample(range(1, nodes + 1), min(LOOKUPS, nodes)):
        started = time.perf_counter()
        await one.fetchrow(f"node-{i}")
        lookups.append(time.perf_counter() - started)
    return SightRead(took, whole["sessions"], whole["stale"], tuple(lookups))

"""Where the liveness worker's flushes choose how they keep a session's last sight: one
place, chosen once per process.

Two ways, each the whole of what a batch's flushes write to the session rows and the
range rows (the gateways' sight rows are the handler's, either way):

- `by_session_rows`: every entry moves its session's row (`rows`), and a range fact also
  keeps its range row (`ranges.keep_ranges`). The only way a liveness worker before 0.4
  knows: its sweep reads `last_seen` alone.
- `by_range_rows`: a range fact writes only the session rows whose standing changes
  (`sight.apply`), and its range row is the others' sight; a flush that names no range,
  or has no stream sequence, still moves its rows one by one (`rows`).

`LastSight` chooses at its first batch of flushes (`BCW_LIVENESS_RANGE_SIGHT`; "auto"
reads the migrations' ledger: `decide.range_sight_on`, said once at INFO by
`sight.switched_on`) and keeps that way for every later batch: one process never mixes
them. Why both ways are still here, and which release may retire `by_session_rows`:
docs/workers.md, "Two ways of keeping a session's last sight".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from schemas.facts import Liveness
from workers.liveness import sight
from workers.liveness.lastsight import rows
from workers.liveness.ranges import keep_ranges
from workers.runtime.effects.worker import Tx

#: a way of keeping last sight: a batch's flushes in, its zombies' rows out (node_id,
#: epoch, gateway_id: each gets a notice to its gateway)
Way = Callable[[Tx, list[Liveness]], Awaitable[list[Any]]]


async def by_session_rows(tx: Tx, flushes: list[Liveness]) -> list[Any]:
    """Range rows first, then every entry's session row (`locks.LOCK_ORDER`)."""
    await keep_ranges(tx, flushes)
    return await rows.move(tx, flushes)


async def by_range_rows(tx: Tx, flushes: list[Liveness]) -> list[Any]:
    """The range facts through their range rows, then the others' session rows one by one
    (`locks.LOCK_ORDER`: range rows, then session rows)."""
    zombies, one_by_one = await sight.apply(tx, flushes)
    return zombies + await rows.move(tx, one_by_one)


async def choose(conn: asyncpg.Connection, setting: bool | str) -> Way:
    """The way `setting` (`BCW_LIVENESS_RANGE_SIGHT`) says on this database."""
    return by_range_rows if await sight.switched_on(conn, setting) else by_session_rows


class LastSight:
    """The seam: the one way this process's flushes keep last sight, chosen at its first
    batch of flushes (`choose`) and the same for every batch after it."""

    def __init__(self, setting: bool | str) -> None:
        self.setting = setting
        self.way: Way | None = None

    async def keep(self, tx: Tx, flushes: list[Liveness]) -> list[Any]:
        """Keep the sight `flushes` say, in `tx`; returns their zombies' rows."""
        if self.way is None:
            self.way = await choose(tx.conn, self.setting)
        return await self.way(tx, flushes)

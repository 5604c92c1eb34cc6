"""The order in which the liveness worker's transactions lock the rows that hold a sight:
one rule, stated here once, and checked against the statements as they run
(tests/integration/workers/liveness/test_lock_order.py watches, from another
connection, which rows each statement of a flush batch and of a sweep holds).

The rule: a transaction takes every lock it **waits** for in `LOCK_ORDER`; once it
holds rows of a table, it takes rows of a table earlier in the order only **without
waiting** (`SKIP LOCKED`). Within a table, rows are locked in key order: range rows by
gateway and range start, session rows by node (as every writer of `node_sessions` locks
them: the gateway's Hello, the other workers), sight rows by gateway.

So a flush batch (the handler) locks range rows, then session rows (its flushes', then
its `closed` facts'), then its gateways' sight rows. The sweep locks its state row, then
every gateway's sight row, then reads range rows (`FOR SHARE SKIP LOCKED`) and locks
session rows (`SKIP LOCKED`) behind them: it never waits for a flush, and a flush may
wait for it — never both, so no cycle forms. `ranges.prune` and `bcw liveness release`
each lock rows of one table alone.

Rows a transaction inserts are new keys, not rows it waits for (an insert waits only for
another transaction's insert of the same key): the rule is about rows that exist.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SWEEP_STATE = "liveness_sweeps"  # the sweep's one row (lease-fenced: one sweep at a time)
RANGES = "liveness_ranges"  # a gateway's range rows (`workers.liveness.ranges`)
SESSIONS = "node_sessions"  # the session rows
SIGHTS = "liveness_gateways"  # the gateways' sight rows (`workers.liveness.blindness`)

#: the order in which a liveness transaction takes the locks it waits for
LOCK_ORDER = (SWEEP_STATE, RANGES, SESSIONS, SIGHTS)

_WITHOUT_WAITING = re.compile(r"\bSKIP\s+LOCKED\b|\bNOWAIT\b", re.IGNORECASE)


def waits(sql: str) -> bool:
    """Whether a statement waits for rows locked elsewhere (it says neither `SKIP LOCKED`
    nor `NOWAIT`). Pure."""
    return _WITHOUT_WAITING.search(sql) is None


def out_of_order(taken: Sequence[tuple[str, bool]]) -> list[int]:
    """Of the locks a transaction took, in the order it took them (each its table and
    whether it waited), the places of those that break `LOCK_ORDER`: a lock waited for on
    a table earlier in the order than one whose rows the transaction already held. Pure."""
    wrong: list[int] = []
    furthest = -1  # the latest place in LOCK_ORDER of a table whose rows are held
    for i, (table, waited) in enumerate(taken):
        place = LOCK_ORDER.index(table)
        if waited and place < furthest:
            wrong.append(i)
        furthest = max(furthest, place)
    return wrong

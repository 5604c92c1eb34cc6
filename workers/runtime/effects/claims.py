"""What the outbox relay claims and settles in the database: `outbox_packs` (one row per
transaction, its messages in parallel arrays: `batch.OutboxBatch.write`) and the `outbox`
rows an older release writes during a rolling upgrade.

A round claims both `FOR UPDATE SKIP LOCKED` as `Item`s, one per message, in the order
they are to go out: the older rows first, then the packs in id order. No message
overtakes an earlier one of its order key: a row waits for an earlier row of its key
held elsewhere (`ROWS_SQL`); a worker's packs go out in the order it wrote them — a pack
waits while an `outbox` row of its worker is left, or an earlier pack of its worker is
held by another relay or held back in this very round (`publishable`) — a row
written after the pack's transaction began does not hold it back, so packs never starve
behind an older release that keeps writing. After
publishing, `settle` deletes what went out, moves what never can to `outbox_dead`, and
shrinks a pack to the messages left.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import asyncpg

#: a pack's message at `place` has the item id -(pack * PACK_SPAN + place + 1): unique beside
#: the `outbox` rows' ids (positive), and its id in `outbox_dead` when it is buried
PACK_SPAN = 1_000_000


class Item(NamedTuple):
    """One message to publish: an `outbox` row, or one message of a pack (a tuple: a
    frozen dataclass's constructor was 7% of a relay's CPU)."""

    id: int
    msg_id: uuid.UUID
    subject: str
    headers: str  # as stored: JSON text
    body: bytes
    order_key: str | None
    created_at: datetime
    pack: int | None = None  # the pack it is in (None: an `outbox` row)
    place: int = 0  # its place in the pack
    worker: str | None = None  # the worker whose row it is (the relay checks what it may send)


@dataclass(frozen=True)
class Pack:
    """What the order rule needs of a claimed pack."""

    id: int
    worker: str | None
    size: int
    waits: bool  # an older row of its worker is left, or an earlier pack of it is held elsewhere


def publishable(packs: Sequence[Pack], cap: int) -> list[int]:
    """The packs of a claim (in id order) to publish this round: not one that waits, nor
    one of a worker with a pack held back before it (that one's messages go first), and
    no more messages than `cap` — though always the first pack that may go. Pure."""
    held: set[str | None] = set()
    chosen: list[int] = []
    total = 0
    for pack in packs:
        if pack.waits or pack.worker in held:
            held.add(pack.worker)
            continue
        if chosen and total + pack.size > cap:
            break  # the rest go next round
        chosen.append(pack.id)
        total += pack.size
    return chosen


# Claims a batch of rows, then gives up the rows whose order_key has an earlier row outside
# the batch (held by another relay, or not yet claimable): those wait their turn.
ROWS_SQL = """
WITH claimed AS (
    SELECT id, order_key FROM outbox WHERE $2::text[] IS NULL OR worker = ANY($2)
     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
SELECT o.id, o.msg_id, o.subject, o.headers, o.body, o.order_key, o.created_at, o.worker
  FROM claimed c JOIN outbox o USING (id)
 WHERE c.order_key IS NULL
    OR NOT EXISTS (
        SELECT 1 FROM outbox earlier
         WHERE earlier.order_key = c.order_key AND earlier.id < c.id
           AND earlier.id NOT IN (SELECT id FROM claimed)
    )
 ORDER BY o.id
"""

# Claims packs; says of each whether it waits (`Pack.waits`): one probe of the worker's
# index per pack, and one look at `outbox` per round (empty once no older release runs).
# `created_at` is the writing transaction's start: an older release's row that began
# first goes first.
PACKS_SQL = """
WITH claimed AS (
    SELECT id, worker, size, created_at FROM outbox_packs
     WHERE $2::text[] IS NULL OR worker = ANY($2)
     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), older AS (
    SELECT worker, min(created_at) AS since FROM outbox GROUP BY worker
)
SELECT c.id, c.worker, c.size,
       EXISTS (SELECT 1 FROM older o
                WHERE o.worker IS NOT DISTINCT FROM c.worker AND o.since <= c.created_at)
    OR EXISTS (SELECT 1 FROM outbox_packs e
                WHERE e.worker IS NOT DISTINCT FROM c.worker AND e.id < c.id
                  AND e.id NOT IN (SELECT id FROM claimed)) AS waits
  FROM claimed c
 ORDER BY c.id
"""

# The messages of the packs chosen (`publishable`), read only for those.
MESSAGES_SQL = """
SELECT id, msg_ids, subjects, headers, bodies, order_keys, created_at, worker
  FROM outbox_packs WHERE id = ANY($1::bigint[]) ORDER BY id
"""


async def claim(conn: asyncpg.Connection, limit: int, owners: list[str] | None) -> list[Item]:
    """A round's messages, in the order they go out (inside the caller's transaction)."""
    items = [
        Item(
            r["id"],
            r["msg_id"],
            r["subject"],
            r["headers"],
            bytes(r["body"]),
            r["order_key"],
            r["created_at"],
            worker=r["worker"],
        )
        for r in await conn.fetch(ROWS_SQL, limit, owners)
    ]
    claimed = await conn.fetch(PACKS_SQL, limit, owners)
    packs = [Pack(r["id"], r["worker"], r["size"], r["waits"]) for r in claimed]
    chosen = publishable(packs, max(limit - len(items), 1))
    for r in await conn.fetch(MESSAGES_SQL, chosen) if chosen else ():
        pack, created_at, worker = r["id"], r["created_at"], r["worker"]
        first = -(pack * PACK_SPAN + 1)  # the item id of its message at place 0
        items += [
            Item(first - i, msg_id, subject, headers, body, key, created_at, pack, i, worker)
            for i, (msg_id, subject, headers, body, key) in enumerate(
                zip(
                    r["msg_ids"],
                    r["subjects"],
                    r["headers"],
                    r["bodies"],
                    r["order_keys"],
                    strict=True,
                )
            )
        ]
    return items


def _as_stored(headers: str) -> str:
    """A buried row's headers as `outbox_dead` keeps them (jsonb): as they were, or — not
    a JSON object (a row no worker of ours wrote, nested past the parser's recursion
    too) — their text under `unparsed`. Pure."""
    try:
        if isinstance(json.loads(headers), dict):
            return headers
    except (ValueError, RecursionError):
        pass
    return json.dumps({"unparsed": headers})


async def settle(
    conn: asyncpg.Connection, items: Sequence[Item], published: Iterable[int], dead: dict[int, str]
) -> None:
    """Delete what went out, move what never can to `outbox_dead`, shrink each pack to the
    messages left (inside the claim's transaction)."""
    gone = set(published) | set(dead)
    rows_gone = [item.id for item in items if item.pack is None and item.id in gone]
    if rows_gone:
        await conn.execute("DELETE FROM outbox WHERE id = ANY($1::bigint[])", rows_gone)
    buried = [item for item in items if item.id in dead]
    if buried:
        await conn.execute(
            """
            INSERT INTO outbox_dead (id, msg_id, subject, headers, body, order_key, created_at,
                                     reason, worker)
            SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[]::jsonb[],
                                 $5::bytea[], $6::text[], $7::timestamptz[], $8::text[], $9::text[])
            """,
            *(
                list(column)
                for column in zip(
                    *(
                        (
                            i.id,
                            i.msg_id,
                            i.subject,
                            _as_stored(i.headers),
                            i.body,
                            i.order_key,
                            i.created_at,
                            dead[i.id],
                            i.worker,
                        )
                        for i in buried
                    ),
                    strict=True,
                )
            ),
        )
    packs: dict[int, list[Item]] = {}
    for item in items:
        if item.pack is not None:
            packs.setdefault(item.pack, []).append(item)
    emptied = []
    for pack, its in packs.items():
        left = [i for i in its if i.id not in gone]
        if not left:
            emptied.append(pack)
        elif len(left) < len(its):
            await conn.execute(
                "UPDATE outbox_packs SET size = $2, msg_ids = $3, subjects = $4, headers = $5,"
                " bodies = $6, order_keys = $7 WHERE id = $1",
                pack,
                len(left),
                [i.msg_id for i in left],
                [i.subject for i in left],
                [i.headers for i in left],
                [i.body for i in left],
                [i.order_key for i in left],
            )
    if emptied:
        await conn.execute("DELETE FROM outbox_packs WHERE id = ANY($1::bigint[])", emptied)


async def waiting(conn: asyncpg.Connection, owners: list[str] | None) -> tuple[int, float]:
    """Messages left to publish (`outbox` rows and packs' messages, of `owners` or all) and
    the age in seconds of the oldest."""
    row = await conn.fetchrow(
        """
        SELECT coalesce(r.n, 0) + coalesce(p.n, 0) AS n,
               extract(epoch FROM now() - least(r.oldest, p.oldest)) AS age
          FROM (SELECT count(*) AS n, min(created_at) AS oldest FROM outbox
                 WHERE $1::text[] IS NULL OR worker = ANY($1)) r,
               (SELECT sum(size) AS n, min(created_at) AS oldest
                  FROM outbox_packs WHERE $1::text[] IS NULL OR worker = ANY($1)) p
        """,
        owners,
    )
    return int(row["n"]), max(0.0, float(row["age"] or 0.0))

"""The Hello flow of `bcw bench chaos` and its count, also used by the fault and upgrade
tests: nodes joined as a gateway's Hello transaction leaves them, a Hello per node
published at a steady rate and re-published through any outage with the same
`Nats-Msg-Id`, and what the workers made of them.

A Hello's effects are counted where an operator would see them: its `node.connected`
and `node.capabilities-changed` events (exactly one each, per node), its capabilities
row, the inbox rows of the two workers it concerns that keep one (liveness, replay) and
the labels of the third (the labeler keeps no inbox: its effects are idempotent by
construction).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable

import asyncpg
import nats
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from workers.bench.common import hello_fact, wire
from workers.runtime.bus import deadletter
from workers.runtime.effects import claims

GATEWAY = "gw-0"
HELLO_WORKERS = ("labeler", "liveness", "replay")
#: those of them that keep an inbox row per fact; the labeler's labels say it is done
INBOX_WORKERS = ("liveness", "replay")

#: per Hello, once handled: an inbox row of each worker that keeps one, and its node labeled
HANDLED = """
SELECT (SELECT count(*) FROM processed_facts WHERE consumer = ANY($1::text[]))
     + (SELECT count(DISTINCT node_id) FROM node_labels WHERE source = 'system')
"""


async def join_fleet(database_url: str, nodes: list[str]) -> None:
    """`nodes` joined, each with a session at epoch 1 on `GATEWAY` (as its Hello transaction
    leaves it), and the gateway's lease for a day."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) "
            "VALUES ($1, 1, compute_now() + interval '1 day')",
            GATEWAY,
        )
        await conn.execute(
            "SELECT join_node(n, 'worker', n || '-serial', NULL) FROM unnest($1::text[]) AS n",
            nodes,
        )
        await conn.execute(
            """
            UPDATE node_sessions SET session_epoch = 1, gateway_id = $1, boot_id = 'boot-1',
                   journal_id = 'journal-1', connected_at = compute_now(), last_seen = compute_now()
            """,
            GATEWAY,
        )
    finally:
        await conn.close()


def capabilities(node: str) -> list[str]:
    return sorted({"gpu", f"rack-{int(node.rsplit('-', 1)[1]) % 7}"})


async def publish_hellos(
    nc: NATS,
    subjects: Subjects,
    nodes: list[str],
    rate: float,
    shape: Callable[[bytes], bytes] | None = None,
) -> None:
    """A Hello per node at `rate` per second, each through any outage with the same
    `Nats-Msg-Id`; `shape` rewrites each body (as another release's gateway sends it)."""
    js = nc.jetstream()
    started = time.monotonic()
    for i, node in enumerate(nodes):
        fact = hello_fact(node, gateway_id=GATEWAY, capabilities=capabilities(node))
        subject, body, headers = wire(subjects, fact)
        body = shape(body) if shape is not None else body
        while True:  # through a restart: the same Nats-Msg-Id, so JetStream keeps one
            try:
                await js.publish(subject, body, headers=headers, timeout=2)
                break
            except Exception:
                await asyncio.sleep(0.2)
        await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))


async def hellos_handled(database_url: str) -> int:
    """3 per Hello once its three workers handled it (`HANDLED`; 0 while the database
    cannot be reached)."""
    with contextlib.suppress(Exception):
        conn = await asyncpg.connect(database_url, timeout=3)
        try:
            return int(await conn.fetchval(HANDLED, list(INBOX_WORKERS)))
        finally:
            await conn.close()
    return 0


async def wait_settled(database_url: str, hellos: int, within: float) -> float:
    """Seconds until every Hello was handled by its three workers and the outbox is empty
    (-1 when not within `within`)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if await hellos_handled(database_url) == hellos * len(HELLO_WORKERS):
            with contextlib.suppress(Exception):
                conn = await asyncpg.connect(database_url, timeout=3)
                try:
                    if (await claims.waiting(conn, None))[0] == 0:
                        return time.monotonic() - started
                finally:
                    await conn.close()
        await asyncio.sleep(1)
    return -1.0


async def count_effects(
    database_url: str, subjects: Subjects, nc: NATS, nodes: list[str]
) -> dict[str, int]:
    """Facts published, effects applied (each node's two events and its capabilities row),
    duplicates, lost, dead-lettered, the inbox rows of the Hello workers that keep one and
    the nodes labeled."""
    conn = await asyncpg.connect(database_url)
    try:
        stored = {
            r["node_id"]: list(r["capabilities"] or [])
            for r in await conn.fetch("SELECT node_id, capabilities FROM node_sessions")
        }
        inbox = Counter(
            dict(await conn.fetch("SELECT consumer, count(*) FROM processed_facts GROUP BY 1"))
        )
        labeled = await conn.fetchval(
            "SELECT count(DISTINCT node_id) FROM node_labels WHERE source = 'system'"
        )
    finally:
        await conn.close()
    events = await _events(nc, subjects)
    connected = events.get("node.connected", Counter())
    changed = events.get("node.capabilities-changed", Counter())
    applied = sum(
        1
        for node in nodes
        if connected[node] and changed[node] and stored.get(node) == capabilities(node)
    )
    duplicates = sum(n - 1 for n in connected.values() if n > 1)
    duplicates += sum(n - 1 for n in changed.values() if n > 1)
    dead = await _count_dead(nc, subjects)
    return {
        "facts published": len(nodes),
        "effects applied": applied,
        "duplicates": duplicates,
        "lost": len(nodes) - applied,
        "dead-lettered": dead,
        **{f"inbox rows ({worker})": inbox[worker] for worker in INBOX_WORKERS},
        "nodes labeled": int(labeled),
    }


async def _events(nc: NATS, subjects: Subjects, within: float = 120) -> dict[str, Counter[str]]:
    """Every event on the events stream, counted per type and node: read until the
    consumer has none pending (a fetch that times out on a loaded machine is tried again,
    never taken for the end of the stream)."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(subjects.all_events, stream=subjects.events_stream)
    total = (await sub.consumer_info()).num_pending or 0  # the events there are, to the last
    out: dict[str, Counter[str]] = {}
    seen, deadline = 0, time.monotonic() + within
    try:
        while seen < total and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(500, timeout=2)
            except TimeoutError:  # nats-py raises nats' own or asyncio's: both are this
                continue
            for msg in msgs:
                seen += 1
                body = json.loads(msg.data)
                bc_type = (msg.headers or {}).get("Bc-Type", "")
                out.setdefault(bc_type, Counter())[body.get("nodeId", "")] += 1
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return out


async def _count_dead(nc: NATS, subjects: Subjects) -> int:
    """Letters in every dead stream (each publisher's, and an old one's)."""
    js, held = nc.jetstream(), 0
    for stream in await deadletter.dead_streams(js, subjects):
        try:
            held += int((await js.stream_info(stream)).state.messages)
        except nats.js.errors.NotFoundError:
            continue
    return held

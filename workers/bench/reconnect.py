"""A reconnect storm's Hello facts through one worker: `bcw bench labeler` and `bcw bench
replay`.

- labeler: N nodes with sessions at epoch 1; one Hello each, advertising 8 capabilities
  (one of them changes between the storm and the sessions' stored set, so every Hello
  writes capabilities, adds and removes labels, and publishes an event). Prints Hellos/s.
- replay: N nodes (10,000) with 10 commands in flight each at epoch 1 reconnect: every
  session is bumped to epoch 2 (what the gateways' Hello transactions do) and N Hellos are
  published, each listing 2 of its 10 commands as still running. The replay worker moves
  all of them to epoch 2 and re-sends the other 8 (dispatch notices and `command.replayed`
  events through the outbox). Prints commands/s and the time until every command is at
  epoch 2, and until every notice is published.
"""

from __future__ import annotations

import uuid

import asyncpg

from schemas.subjects import Subjects
from workers import labeler, replay
from workers.bench.common import (
    bench_target,
    consume_and_relay,
    hello_fact,
    join_fleet,
    print_table,
    publish_facts,
    wire,
)
from workers.runtime.effects import claims
from workers.settings import Settings

CAPABILITIES = ["cpu", "mem", "nvml", "cuda.12", "ib", "nvme", "gpu.h100", "new-cap"]


async def run_labeler(settings: Settings, nodes: int, embedded: bool) -> int:
    async with bench_target(settings, embedded) as target:
        subjects = Subjects(target.subject_root)
        print(f"joining {nodes} nodes and publishing their Hellos ...")
        await join_fleet(target.database_url, nodes)
        conn = await asyncpg.connect(target.database_url)
        try:  # the stored set before the storm: 7 of the 8, and one to remove
            await conn.execute(
                "UPDATE node_sessions SET capabilities = '{cpu,mem,nvml,cuda.12,ib,nvme,gpu.h100,old-cap}'"
            )
        finally:
            await conn.close()
        facts = [
            wire(subjects, hello_fact(f"node-{i}", capabilities=CAPABILITIES))
            for i in range(1, nodes + 1)
        ]
        await publish_facts(target.nats_url, facts)
        settled, _drained = await consume_and_relay(
            target, labeler.build(settings), nodes, drain=True
        )
        rate = nodes / settled
        conn = await asyncpg.connect(target.database_url)
        try:
            labels = await conn.fetchval("SELECT count(*) FROM node_labels WHERE source = 'system'")
            changed = (await claims.waiting(conn, None))[0]
        finally:
            await conn.close()
    print_table(
        f"bcw bench labeler: {nodes} Hellos (8 capabilities each, one changed)",
        ("measure", "value"),
        [
            ("Hellos/s labeled", f"{rate:,.0f}"),
            ("system labels", f"{labels:,}"),
            ("outbox rows left", f"{changed:,}"),
        ],
    )
    return 0


PER_NODE = 10
PREVIOUS = {
    "epoch": 1,
    "gateway_id": "gw-0",
    "boot_id": "boot-1",
    "journal_id": "journal-1",
    "live": False,
}
RUNNING = 2

IN_FLIGHT = """
INSERT INTO commands (node_id, seq, kind, lane, state, session_epoch, delivery_attempt, payload)
SELECT s.node_id, k, 'exec', 'default', 'running', 1, 1, '{}'
  FROM node_sessions s, generate_series(1, $1::int) k;
UPDATE nodes SET last_command_seq = $1::int;
"""


async def run_replay(settings: Settings, nodes: int, embedded: bool) -> int:
    async with bench_target(settings, embedded) as target:
        subjects = Subjects(target.subject_root)
        print(f"{nodes:,} nodes with {PER_NODE} commands in flight each ...")
        await join_fleet(target.database_url, nodes)
        conn = await asyncpg.connect(target.database_url)
        try:
            await conn.execute(IN_FLIGHT.replace("$1::int", str(PER_NODE)))
            await conn.execute(
                "UPDATE node_sessions SET session_epoch = 2, gateway_id = 'gw-0'"
            )  # the storm
            running: dict[str, list[uuid.UUID]] = {}
            for row in await conn.fetch(
                f"SELECT node_id, command_id FROM commands WHERE seq <= {RUNNING}"
            ):
                running.setdefault(row["node_id"], []).append(row["command_id"])
        finally:
            await conn.close()
        facts = [
            wire(
                subjects,
                hello_fact(n, epoch=2, session_id="s2", running_command_ids=ids, previous=PREVIOUS),
            )
            for n, ids in running.items()
        ]
        await publish_facts(target.nats_url, facts)
        worker = replay.build(settings)
        worker = type(worker)(
            name=worker.name, fact_types=worker.fact_types, handle=worker.handle
        )  # no dispatch loop
        settled, drained = await consume_and_relay(target, worker, nodes, drain=True)
        conn = await asyncpg.connect(target.database_url)
        try:
            moved = await conn.fetchval("SELECT count(*) FROM commands WHERE session_epoch = 2")
            resent = await conn.fetchval("SELECT count(*) FROM commands WHERE delivery_attempt = 2")
        finally:
            await conn.close()
    total = nodes * PER_NODE
    print_table(
        f"bcw bench replay: {nodes:,} Hellos, {total:,} commands in flight",
        ("measure", "value"),
        [
            ("commands moved to the new epoch", f"{moved:,}"),
            ("commands re-sent", f"{resent:,}"),
            ("commands/s replayed", f"{total / settled:,.0f}"),
            ("Hellos/s", f"{nodes / settled:,.0f}"),
            ("converged (all at epoch 2)", f"{settled:.1f} s"),
            ("… and every notice published", f"{drained:.1f} s"),
        ],
    )
    return 0

"""`bcw bench labeler`: a reconnect storm's Hello facts through the capability labeler.

N nodes with sessions at epoch 1; one Hello each, advertising 8 capabilities (one of
them changes between the storm and the sessions' stored set, so every Hello writes
capabilities, adds and removes labels, and publishes an event). Prints Hellos/s.
"""

from __future__ import annotations

import asyncpg

from schemas.subjects import Subjects
from workers import labeler
from workers.bench.common import (
    bench_target,
    consume_and_relay,
    hello_fact,
    join_fleet,
    print_table,
    publish_facts,
    wire,
)
from workers.runtime.base.settings import Settings
from workers.runtime.effects import claims

CAPABILITIES = ["cpu", "mem", "nvml", "cuda.12", "ib", "nvme", "gpu.h100", "new-cap"]


async def run(settings: Settings, nodes: int, embedded: bool) -> int:
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

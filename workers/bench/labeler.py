"""`bcw bench labeler`: a reconnect storm's Hello facts through the capability labeler.

N nodes with sessions at epoch 1; one Hello each, advertising 8 capabilities (one of
them changes between the storm and the sessions' stored set, so every Hello writes
capabilities, adds and removes labels, and publishes an event). Prints Hellos/s.
"""

from __future__ import annotations

import uuid

import asyncpg

from schemas import REGISTRY, Hello
from schemas.subjects import Subjects
from workers import labeler
from workers.bench.common import bench_target, consume_all, join_fleet, print_table, publish_facts
from workers.runtime.settings import Settings


def _hello(node_id: str) -> Hello:
    return Hello.model_validate(
        {
            "fact_id": uuid.uuid4(),
            "gateway_id": "gw-0",
            "observed_at": "2026-11-30T00:00:00Z",
            "node_id": node_id,
            "session_id": "s",
            "epoch": 1,
            "role": "worker",
            "boot_id": "boot-1",
            "journal_id": "journal-1",
            "daemon_version": "1.0.0",
            "proto_max": 3,
            "trust_version": 1,
            "capabilities": ["cpu", "mem", "nvml", "cuda.12", "ib", "nvme", "gpu.h100", "new-cap"],
            "running_command_ids": [],
            "inventory_hashes": {},
            "cert": {},
            "upgrade_required": False,
            "transport": "grpc",
            "previous": {"epoch": 0, "live": False},
        },
        strict=False,
    )


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
        facts = []
        for i in range(1, nodes + 1):
            hello = _hello(f"node-{i}")
            body, headers = REGISTRY.encode(hello)
            headers["Nats-Msg-Id"] = str(hello.fact_id)
            facts.append((subjects.fact("gw-0", "hello"), body, headers))
        await publish_facts(target.nats_url, facts)
        rate = await consume_all(target, labeler.build(settings), nodes)
        conn = await asyncpg.connect(target.database_url)
        try:
            labels = await conn.fetchval("SELECT count(*) FROM node_labels WHERE source = 'system'")
            changed = await conn.fetchval("SELECT count(*) FROM outbox")
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

"""`bcw sim`: one scenario against the NATS and PostgreSQL of the environment (the
workers run elsewhere: `bcw run all`, or the chart). Prints the checks; exit 0 if all hold."""

from __future__ import annotations

import uuid

import asyncpg
from rich.console import Console
from rich.table import Table

from schemas.subjects import Subjects
from workers.runtime.base.settings import Settings
from workers.runtime.bus import connection, streams
from workers.sim.scenarios import SCENARIOS
from workers.sim.simulator import Simulator


async def run_scenario(
    settings: Settings, scenario: str, nodes: int, gateways: int, seed: int
) -> int:
    console = Console()
    subjects = Subjects(settings.subject_root)
    nc = await connection.connect(settings.nats, name="bcw sim")
    pool = await asyncpg.create_pool(
        settings.database.url.get_secret_value(), min_size=2, max_size=8
    )
    prefix = f"sim{uuid.uuid4().hex[:6]}"
    sim = Simulator(pool, nc, subjects, nodes=nodes, gateways=gateways, seed=seed, prefix=prefix)
    try:
        await streams.provision_streams(nc.jetstream(), subjects, settings.nats.stream_replicas)
        await sim.start()
        sim.progress = lambda phase: console.log(phase)
        checks = await SCENARIOS[scenario](sim)
    finally:
        await sim.stop()
        await pool.close()
        await nc.close()
    table = Table(title=f"bcw sim {scenario}: {nodes} nodes ({prefix}-*) over {gateways} gateways")
    for column in ("check", "expected", "actual", ""):
        table.add_column(column)
    for c in checks:
        table.add_row(c.name, c.expected, c.actual, "ok" if c.ok else "FAIL")
    console.print(table)
    return 0 if all(c.ok for c in checks) else 1

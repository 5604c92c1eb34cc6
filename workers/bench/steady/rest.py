"""`bcw bench rest`: what the workers other than the liveness controller cost while a
fleet is at rest — N sessions connected an hour before, every Hello seen, no command,
no fact arriving — so that whatever they do on their own grows with nothing.

`bcw bench steady` holds a fleet with the liveness worker alone (its flushes and sweeps
are what a fleet at rest asks of it); this runs the labeler, the quarantine enforcer,
the recorder and the replay dispatcher, each in a `bcw run` process of its own, for M
minutes after their start, and prints one line a minute and the CPU of each process and
of the servers. Their loops — leases, the relays' polls, the dispatch loop's looks for
ready nodes, lost Hellos and expired holds, the breaker's release loop — must each cost
the same at 10,000 sessions as at a million.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from workers.bench.common import bench_target, print_table, spawn_workers, stop_workers, worker_env
from workers.bench.costs import CpuSpent, cpu_seconds
from workers.bench.steady import fleet
from workers.settings import Settings

AT_REST = ("labeler", "quarantine", "recorder", "replay")
#: what the workers' start-up does (their first looks read everything once) is not counted
SETTLE_S = 20.0


async def _at_rest(conn: asyncpg.Connection, nodes: int, gateways: int) -> None:
    """`nodes` sessions as a fleet at rest leaves them: connected an hour before on gateways
    whose leases hold (`fleet.prepare`, as `bcw bench steady` makes its fleet), every Hello
    applied, no command; the tables vacuumed."""
    await fleet.prepare(conn, nodes, gateways)
    await conn.execute(
        """
        UPDATE node_sessions SET connected_at = compute_now() - interval '1 hour';
        INSERT INTO hello_seen (node_id, seen_epoch) SELECT node_id, 1 FROM node_sessions;
        """
    )
    await conn.execute("VACUUM ANALYZE")


async def run(settings: Settings, nodes: int, gateways: int, minutes: int, embedded: bool) -> int:
    async with bench_target(settings, embedded) as target:
        conn = await asyncpg.connect(target.database_url)
        try:
            print(f"a fleet at rest: {nodes:,} sessions on {gateways} gateways ...")
            await _at_rest(conn, nodes, gateways)
        finally:
            await conn.close()
        procs = await spawn_workers(worker_env(target), names=AT_REST)
        try:
            await asyncio.sleep(SETTLE_S)
            start = time.monotonic()
            first = last = CpuSpent.now()
            workers_first = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
            for minute in range(1, minutes + 1):
                await asyncio.sleep(start + 60 * minute - time.monotonic())
                now = CpuSpent.now()
                spent = now - last
                print(
                    f"minute {minute}: PostgreSQL {spent.postgres / 60:.3f} cores, "
                    f"nats-server {spent.nats / 60:.3f}",
                    flush=True,
                )
                last = now
            workers = {
                name: cpu_seconds(proc.pid) - workers_first[name] for name, proc in procs.items()
            }
            spent = CpuSpent.now() - first
        finally:
            await stop_workers(procs)
    seconds = 60.0 * minutes
    rows = [(f"{name} process", f"{used / seconds:.4f}") for name, used in workers.items()]
    rows += [
        ("postgres (all processes)", f"{spent.postgres / seconds:.4f}"),
        ("nats-server (all processes)", f"{spent.nats / seconds:.4f}"),
    ]
    print_table(
        f"bcw bench rest: {nodes:,} sessions at rest, {minutes} min after the workers' "
        f"first {SETTLE_S:.0f} s",
        ("process", "cores"),
        rows,
    )
    return 0

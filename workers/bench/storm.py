"""`bcw bench storm`: a power-on herd against every worker.

N nodes (100,000) over M reference gateways (20; 60 s leases, as 20 gateways share one
process and its event loop here) say Hello at once, each with 5
capabilities and one command in flight from before, while the five workers run each in a
`bcw run <worker>` process of its own. Reports Hello facts/s through each worker, the
time from the last Hello to every effect applied (labels, connected events, replays, the
outbox published), and each worker's peak RSS.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import asyncpg
import nats

from schemas.subjects import Subjects
from workers.bench.common import (
    bench_target,
    consumer_idle,
    join_herd,
    peak_rss_mib,
    print_table,
    spawn_workers,
    wait_until,
    worker_env,
)
from workers.gateway import Code, Gateway, GatewaySettings, HelloRequest, Refused
from workers.runtime.settings import Settings

HELLO_WORKERS = ("labeler", "liveness", "quarantine", "replay")


class _Stream:
    async def deliver(self, dispatch: object) -> None:
        return None

    async def event_ack(self, journal_id: str, seq: int) -> None:
        return None

    def drop(self, reason: str) -> None:
        return None


async def run(settings: Settings, nodes: int, gateways: int, embedded: bool) -> int:
    async with bench_target(settings, embedded) as target:
        subjects = Subjects(target.subject_root)
        conn = await asyncpg.connect(target.database_url)
        print(f"joining {nodes:,} nodes, one command in flight each ...")
        await join_herd(conn, nodes)
        procs = await spawn_workers(worker_env(target))
        nc = await nats.connect(target.nats_url, pending_size=256 * 1024 * 1024)
        # each gateway has a pool of its own, as separate gateway processes would
        pools = [
            await asyncpg.create_pool(target.database_url, min_size=1, max_size=4)
            for _ in range(gateways)
        ]
        fleet = [
            Gateway(
                f"gw-{g}",
                pools[g],
                nc,
                subjects,
                settings=GatewaySettings(max_streams=max(5000, nodes), lease_ttl=60.0),
            )
            for g in range(gateways)
        ]
        try:
            for gateway in fleet:
                await gateway.start(autotick=1.0)
            await asyncio.sleep(2.0)  # workers provisioned and bound
            pushback = 0
            todo: asyncio.Queue[int] = asyncio.Queue()
            for i in range(1, nodes + 1):
                todo.put_nowait(i)

            async def client() -> None:
                """One of gateways x maxPendingHellos connections saying Hello in turn."""
                nonlocal pushback
                while not todo.empty():
                    i = todo.get_nowait()
                    request = HelloRequest(
                        node_id=f"node-{i}", cert_serial=f"node-serial-{i}", role="worker",
                        boot_id=uuid.uuid4().hex[:8], journal_id="journal-1",
                        capabilities=["cpu", "mem", "nvml", f"rack{i % 40}", "ib"],
                    )  # fmt: skip
                    target = i
                    while True:
                        try:
                            await fleet[target % gateways].hello(request, _Stream())
                            break
                        except Refused as refused:
                            if refused.code is Code.RESOURCE_EXHAUSTED:
                                pushback += 1
                                await asyncio.sleep(refused.retry_after or 0.1)
                            elif refused.code is Code.UNAVAILABLE:
                                target += 1  # as a daemon would: another gateway
                            else:
                                raise

            async def heartbeats() -> None:
                """The daemons' heartbeats, every 5 s (the sessions must stay alive)."""
                while True:
                    await asyncio.sleep(5)
                    for gateway in fleet:
                        for session in list(gateway.sessions.values()):
                            gateway.heartbeat(session.node_id, session.epoch)

            beating = asyncio.create_task(heartbeats())
            print(f"power-on: {nodes:,} Hellos over {gateways} gateways ...")
            first = time.monotonic()
            await asyncio.gather(*(client() for _ in range(gateways * 64)))
            last = time.monotonic()
            js = nc.jetstream()
            done = {}
            for name in HELLO_WORKERS:

                async def idle(name: str = name) -> bool:
                    return await consumer_idle(js, subjects.facts_stream, name)

                done[name] = await wait_until(idle)
            labels_sql = "SELECT count(*) FROM node_labels WHERE source = 'system'"
            replay_sql = (
                "SELECT count(*) FROM commands WHERE session_epoch = 1 AND delivery_attempt = 2"
            )

            async def effects() -> bool:
                return (
                    await conn.fetchval(labels_sql) == 5 * nodes
                    and await conn.fetchval(replay_sql) == nodes
                    and await conn.fetchval("SELECT count(*) FROM outbox") == 0
                )

            settled = await wait_until(effects)
            rss = {name: peak_rss_mib(proc.pid) for name, proc in procs.items()}
            beating.cancel()
        finally:
            for gateway in fleet:
                await gateway.stop(graceful=False)
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*(p.wait() for p in procs.values()))
            for pool in pools:
                await pool.close()
            await nc.close()
            await conn.close()
    rows = [
        (
            "Hellos accepted by the gateways",
            f"{nodes / (last - first):,.0f} /s ({last - first:.1f} s, {pushback:,} pushed back)",
        )
    ]
    rows += [
        (f"{name}: Hello facts/s", f"{nodes / (done[name] - first):,.0f}") for name in HELLO_WORKERS
    ]
    rows += [("last Hello → every effect applied", f"{settled - last:.1f} s")]
    rows += [(f"{name}: peak RSS", f"{rss[name]:.0f} MiB") for name in sorted(rss)]
    print_table(
        f"bcw bench storm: {nodes:,} nodes over {gateways} gateways", ("measure", "value"), rows
    )
    return 0

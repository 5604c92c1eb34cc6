"""`bcw bench rollout --power-on`: N daemons (10,000) powering on at once against G
reference gateways (2) with the handshake bucket at 200 Hellos/s each, every Hello the
real one (proof at `require`), run twice: the gateways' pushback honoured (the seed's
rule), then ignored for the daemons' own full-jitter doubling (as before it). The connect
tail of each — seconds from power-on to each daemon's Welcome — shows what the pushback
does (the seed: before it, a 10,000-node herd's tail was its own back-off, 65 s).
Only the gateways' side runs: what the workers make of a herd is `bcw bench herd`'s."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import nats

from schemas.subjects import Subjects
from workers.bench.common import bench_target, print_table, wait_until
from workers.bench.rollout import gateways as gws
from workers.bench.rollout.daemons import Daemons
from workers.bench.steady.figures import percentile
from workers.settings import Settings

WITHIN = 300.0


async def herd(
    settings: Settings, nodes: int, gateways: int, embedded: bool, honour: bool
) -> tuple[list[float], int, int]:
    """Seconds from power-on to each Welcome, the refusals the herd met, and the daemons
    still out when the run gave up (`WITHIN`)."""
    async with bench_target(settings, embedded) as target:
        subjects = Subjects(target.subject_root)
        conn = await asyncpg.connect(target.database_url)
        try:
            await conn.execute(
                "SELECT join_node('node-' || i, 'worker', 'node-serial-' || i, NULL) "
                "FROM generate_series(1, $1) i",
                nodes,
            )
            daemons = gws.daemons(nodes, 1, (1.0, 1.0))
            await gws.enroll(conn, daemons)
        finally:
            await conn.close()
        nc = await nats.connect(target.nats_url)
        pools = await gws.pools(target.database_url)
        gw_settings = gws.settings(rate=200.0)
        up = [
            await gws.started(pools, nc, subjects, f"gw-{g}", gw_settings) for g in range(gateways)
        ]
        stopping = asyncio.Event()
        try:
            for daemon in daemons:
                daemon.honour_pushback = honour
                daemon.process_started = daemon.next_try = time.time()
            fleet = Daemons(daemons, up)  # type: ignore[arg-type]
            fleet.active = {d.node_id: d for d in daemons}
            fleet.started = time.time()
            driving = asyncio.create_task(fleet.run(stopping, interval=0.02))

            async def all_in() -> bool:
                return len(fleet.connects) >= nodes

            try:
                await wait_until(all_in, within=WITHIN)
            except TimeoutError:
                out = [d for d in daemons if not d.connected]
                held = {g.gateway_id: len(g.sessions) for g in up}
                print(
                    f"  {len(out)} daemon(s) not connected after {WITHIN:.0f} s (sessions held "
                    f"{held}; failed dials {dict(fleet.errors)}), e.g. "
                    f"{[d.state() for d in out[:3]]}",
                    flush=True,
                )
            stopping.set()
            await driving
            refusals = sum(sum(d.refusals.values()) for d in daemons)
        finally:
            stopping.set()
            for gateway in up:
                await gateway.stop(graceful=False)
            await pools.close()
            await nc.close()
    return fleet.connects, refusals, nodes - len(fleet.connects)


async def run(settings: Settings, nodes: int, gateways: int, embedded: bool) -> int:
    rows = []
    tails = {}
    for honour, name in ((True, "pushback honoured"), (False, "own doubling (pushback ignored)")):
        print(f"power-on: {nodes:,} daemons, {gateways} gateways at 200/s, {name} ...", flush=True)
        connects, refusals, out = await herd(settings, nodes, gateways, embedded, honour)
        tails[honour] = max(connects) if not out else float("inf")
        rows.append(
            (
                name,
                f"{percentile(connects, 0.5):.1f}",
                f"{percentile(connects, 0.99):.1f}",
                f"{max(connects):.1f}" if not out else f"> {WITHIN:.0f} ({out} out)",
                f"{refusals:,}",
            )
        )
    floor = nodes / (gateways * 200.0)
    print_table(
        f"bcw bench rollout --power-on: {nodes:,} daemons at once, {gateways} gateways at "
        f"200 Hellos/s each (the bucket's floor: {floor:.0f} s)",
        ("daemons", "connect p50 s", "p99 s", "tail s", "refusals"),
        rows,
    )
    print(
        f"power-on tail: {tails[True]:.1f} s with the pushback honoured, {tails[False]:.1f} s "
        f"with the daemons' own doubling",
        flush=True,
    )
    return 0 if tails[True] < tails[False] else 1

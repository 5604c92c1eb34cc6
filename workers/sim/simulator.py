"""The fleet simulator (`bcw sim`, and a library for tests and the demo).

N fake daemons over M reference gateways in one process, against given NATS and
PostgreSQL; the workers run elsewhere (or in the same event loop). Simulated time runs
`speed` times faster than the wall clock through `compute_now()`'s offset, so scenarios
that need minutes (a gateway's 120 s grace, back-offs, the quarantine window) take
seconds. Each scenario returns checks of the database and of the published events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.subjects import Subjects
from workers.gateway import Gateway, GatewaySettings
from workers.sim.clock import SimClock
from workers.sim.daemon import FakeDaemon

log = logging.getLogger(__name__)

CAPABILITY_POOL = ["cpu", "mem", "nvml", "cuda.12", "ib", "nvme", "gpu.h100", "gpu.a100", "fpga"]


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    actual: str
    ok: bool


class Simulator:
    def __init__(
        self,
        pool: asyncpg.Pool,
        nc: NATS,
        subjects: Subjects,
        *,
        nodes: int,
        gateways: int,
        seed: int = 1,
        prefix: str = "sim",
        gateway_settings: GatewaySettings | None = None,
    ) -> None:
        self.pool = pool
        self.nc = nc
        self.subjects = subjects
        self.n_nodes = nodes
        self.n_gateways = gateways
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.gateway_settings = gateway_settings or GatewaySettings()
        self.gateways: list[Gateway] = []
        self.daemons: list[FakeDaemon] = []
        self.progress: Callable[[str], None] = lambda _text: None

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        async with self.pool.acquire() as conn:
            await self.clock.reset(conn)
            await conn.execute(
                "SELECT join_node($1 || '-' || i, 'worker', $1 || '-serial-' || i, NULL) FROM generate_series(1, $2) i",
                self.prefix,
                self.n_nodes,
            )
        for g in range(self.n_gateways):
            gateway = Gateway(
                f"{self.prefix}-gw-{g}",
                self.pool,
                self.nc,
                self.subjects,
                self.clock,
                self.gateway_settings,
            )
            await gateway.start()
            self.gateways.append(gateway)
        for i in range(1, self.n_nodes + 1):
            caps = sorted(self.rng.sample(CAPABILITY_POOL, self.rng.randint(2, 5)))
            self.daemons.append(
                FakeDaemon(
                    f"{self.prefix}-{i}",
                    f"{self.prefix}-serial-{i}",
                    self.clock,
                    self.rng,
                    caps,
                    home=i % self.n_gateways,
                )
            )

    async def stop(self) -> None:
        for gateway in self.gateways:
            if gateway.alive:
                await gateway.stop(graceful=False)
        async with self.pool.acquire() as conn:
            await self.clock.reset(conn)

    # -- time ------------------------------------------------------------------------------
    async def tick(self) -> None:
        for gateway in self.gateways:
            await gateway.tick()
        limit = asyncio.Semaphore(512)  # a herd: many daemons at once

        async def one(daemon: FakeDaemon) -> None:
            async with limit:
                await daemon.tick(self.gateways)

        await asyncio.gather(*(one(d) for d in self.daemons))

    async def run(
        self,
        until: Callable[[], Awaitable[bool]],
        *,
        within: float = 60.0,
        speed: float = 5.0,
        what: str = "",
        interval: float = 0.1,
    ) -> bool:
        """Tick until `until()` holds (checked every second) or `within` wall seconds pass."""
        deadline = time.monotonic() + within
        checked = 0.0
        async with self.pool.acquire() as conn:
            while time.monotonic() < deadline:
                started = time.monotonic()
                await self.tick()
                if started - checked >= 1.0:
                    checked = started
                    if await until():
                        return True
                    if what:
                        self.progress(what)
                elapsed = time.monotonic() - started
                pause = max(0.0, interval - elapsed)
                await asyncio.sleep(pause)
                await self.clock.advance(conn, (pause + elapsed) * (speed - 1))
        return await until()

    # -- looking ---------------------------------------------------------------------------
    async def fetchval(self, sql: str, *args: object) -> object:
        async with self.pool.acquire() as conn:
            return await conn.fetchval(sql, *args)

    async def connected(self) -> int:
        value = await self.fetchval(
            "SELECT count(*) FROM node_sessions WHERE node_id LIKE $1 AND gateway_id IS NOT NULL",
            self.prefix + "-%",
        )
        return int(value)  # type: ignore[call-overload]

    async def enqueue(
        self,
        daemons: Sequence[FakeDaemon],
        per_node: int,
        kind: str = "exec",
        lane: str = "default",
    ) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "SELECT enqueue_command(n, $2, '{}', $3) FROM unnest($1::text[]) n, generate_series(1, $4)",
                [d.node_id for d in daemons],
                kind,
                lane,
                per_node,
            )

    async def events(self) -> Counter[tuple[str, str]]:
        """(type, reason) of every event published under this subject root."""
        js = self.nc.jetstream()
        info = await js.stream_info(self.subjects.events_stream)
        total = info.state.messages
        counts: Counter[tuple[str, str]] = Counter()
        if not total:
            return counts
        sub = await js.pull_subscribe(
            self.subjects.all_events,
            durable=None,
            stream=self.subjects.events_stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30
            ),
        )
        try:
            seen = 0
            while seen < total:
                try:
                    msgs = await sub.fetch(min(1000, total - seen), timeout=2)
                except TimeoutError:
                    break
                for msg in msgs:
                    body = json.loads(msg.data)
                    counts[
                        (
                            msg.headers.get("Bc-Type", "?") if msg.headers else "?",
                            body.get("reason") or "",
                        )
                    ] += 1
                seen += len(msgs)
        finally:
            await sub.unsubscribe()
        return counts

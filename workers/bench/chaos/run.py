"""`bcw bench chaos --minutes N`: a soak under faults, on embedded servers.

Hellos flow at a steady rate (`flow.py`) into the five workers, each a `bcw run` process
reaching NATS and PostgreSQL through TCP proxies. Meanwhile, at random: a worker is
`kill -9`ed and restarted, nats-server or PostgreSQL is restarted, the proxies cut every
connection or refuse or blackhole them for a few seconds. At the end the faults stop, the
flow is waited out, and the figures are printed: facts published, effects applied,
duplicates, lost, dead-lettered. The last three must be 0 (exit 1 otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import nats

from schemas.subjects import Subjects
from workers.bench.chaos.flow import count_effects, join_fleet, publish_hellos, wait_settled
from workers.bench.common import print_table
from workers.bench.proxy import Mode, TcpProxy
from workers.embedded.servers import EmbeddedNats, EmbeddedPostgres
from workers.registry import WORKERS
from workers.runtime.bus import streams
from workers.runtime.store import migrate


@dataclass
class Chaos:
    """The soak's moving parts and what it did to them."""

    base: Path
    nats: EmbeddedNats
    postgres: EmbeddedPostgres
    nats_proxy: TcpProxy
    postgres_proxy: TcpProxy
    database: str
    subjects: Subjects
    rng: random.Random
    processes: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def database_url(self) -> str:
        return self.postgres.url_for(self.database)

    def worker_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "BCW_DATABASE_URL": self.postgres_proxy.url(
                "postgresql", f"/{self.database}", "postgres"
            ),
            "BCW_NATS_URL": self.nats_proxy.url("nats"),
            "BCW_SUBJECT_ROOT": self.subjects.root,
            "BCW_HEALTH_PORT": "0",
            "BCW_LOG_LEVEL": "WARNING",
            "BCW_CONSUMER_ACK_WAIT": "10",
            "BCW_DATABASE_COMMAND_TIMEOUT": "8",
            "BCW_DATABASE_CONNECT_TIMEOUT": "3",
            "BCW_NATS_CONNECT_TIMEOUT": "3",
            # no daemon flushes liveness in this soak: no session may age out meanwhile
            "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",
        }

    async def start_worker(self, name: str) -> None:
        log = (self.base / f"{name}.log").open("ab")
        with log:
            self.processes[name] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "workers.cli",
                "run",
                name,
                env=self.worker_env(),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )

    # -- the faults ------------------------------------------------------------------
    async def kill_a_worker(self) -> None:
        name = self.rng.choice(sorted(self.processes))
        self.processes[name].kill()
        await self.processes[name].wait()
        await asyncio.sleep(self.rng.uniform(0.5, 3))
        await self.start_worker(name)
        self.faults[f"kill -9 {name}"] += 1

    async def restart_nats(self) -> None:
        await asyncio.to_thread(self.nats.stop)
        await asyncio.sleep(self.rng.uniform(1, 5))
        await asyncio.to_thread(self.nats.start)
        self.faults["restart nats-server"] += 1

    async def restart_postgres(self) -> None:
        await asyncio.to_thread(self.postgres.stop)
        await asyncio.sleep(self.rng.uniform(1, 5))
        await asyncio.to_thread(self.postgres.start)
        self.faults["restart postgres"] += 1

    async def cut(self) -> None:
        proxy, what = self.rng.choice(
            [(self.nats_proxy, "nats"), (self.postgres_proxy, "postgres")]
        )
        mode = self.rng.choice([None, Mode.REFUSE, Mode.BLACKHOLE])
        if mode is None:
            proxy.cut()
            self.faults[f"cut {what} connections"] += 1
        else:
            await proxy.outage(self.rng.uniform(2, 10), mode)
            self.faults[f"{mode.value} {what}"] += 1

    async def rampage(self, until: float) -> None:
        faults: list[Callable[[], Awaitable[None]]] = [
            self.kill_a_worker,
            self.kill_a_worker,
            self.restart_nats,
            self.restart_postgres,
            self.cut,
            self.cut,
        ]
        while time.monotonic() < until:
            await asyncio.sleep(min(self.rng.uniform(8, 20), max(0.0, until - time.monotonic())))
            if time.monotonic() < until:
                await self.rng.choice(faults)()


async def run(minutes: float, rate: float, seed: int) -> int:
    base = Path(tempfile.mkdtemp(prefix="bcw-chaos-"))
    nats_server = EmbeddedNats(base / "nats")
    postgres = EmbeddedPostgres(base / "postgres")
    try:
        nats_server.start()
        postgres.start()
        return await _soak(base, nats_server, postgres, minutes, rate, seed)
    finally:
        postgres.stop()
        nats_server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def _soak(
    base: Path,
    nats_server: EmbeddedNats,
    postgres: EmbeddedPostgres,
    minutes: float,
    rate: float,
    seed: int,
) -> int:
    nodes = [f"chaos-{i:06d}" for i in range(max(1, int(minutes * 60 * rate)))]
    database = f"bcw_chaos_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres.url)
    await admin.execute(f'CREATE DATABASE "{database}"')
    await admin.close()
    chaos = Chaos(
        base,
        nats_server,
        postgres,
        await TcpProxy("127.0.0.1", nats_server.port).start(),
        await TcpProxy("127.0.0.1", postgres.port).start(),
        database,
        Subjects(f"chaos{uuid.uuid4().hex[:6]}"),
        random.Random(seed),
    )
    await _prepare(chaos, nodes)
    for name in sorted(WORKERS):
        await chaos.start_worker(name)
    nc = await nats.connect(
        nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=_quiet
    )
    started = time.monotonic()
    print(f"chaos: {len(nodes)} Hellos at {rate:g}/s for {minutes:g} min, faults every 8-20 s")
    try:
        publishing = asyncio.create_task(publish_hellos(nc, chaos.subjects, nodes, rate))
        await chaos.rampage(started + minutes * 60)
        await publishing
        print(f"chaos: faults over after {time.monotonic() - started:.0f} s; waiting for the flow")
        settled = await wait_settled(chaos.database_url, len(nodes), within=300)
        figures = await count_effects(chaos.database_url, chaos.subjects, nc, nodes)
    finally:
        for process in chaos.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        await asyncio.gather(*(p.wait() for p in chaos.processes.values()))
        await nc.close()
        await chaos.nats_proxy.stop()
        await chaos.postgres_proxy.stop()
    print_table(
        "faults injected",
        ("fault", "times"),
        [(fault, str(n)) for fault, n in sorted(chaos.faults.items())],
    )
    print_table("chaos: results", ("figure", "value"), [(k, str(v)) for k, v in figures.items()])
    print(f"settled {settled:.0f} s after the last fact" if settled >= 0 else "did NOT settle")
    bad = figures["duplicates"] or figures["lost"] or figures["dead-lettered"] or settled < 0
    print("FAIL" if bad else "ok: every effect once, nothing lost, nothing dead-lettered")
    return 1 if bad else 0


async def _quiet(_error: Exception) -> None:
    """The publisher's reconnects while nats-server restarts are the point, not news."""


async def _prepare(chaos: Chaos, nodes: list[str]) -> None:
    conn = await asyncpg.connect(chaos.database_url)
    try:
        await migrate.migrate(conn)
    finally:
        await conn.close()
    await join_fleet(chaos.database_url, nodes)
    nc = await nats.connect(chaos.nats.url)
    try:
        await streams.provision_streams(nc.jetstream(), chaos.subjects)
    finally:
        await nc.close()

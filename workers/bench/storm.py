"""`bcw bench storm`: a power-on herd through reference gateways, against every worker.

N nodes (100,000) over M reference gateways (20) say Hello at once, each with 5
capabilities and one command in flight from before. The gateways run in P processes of
their own (4 by default: 5 gateways each, as separate gateway deployments would, each
with its own NATS connection and database pool), each process with `64 x gateways` clients;
the five workers run each in a `bcw run <worker>` process of its own. Reports the Hellos
the gateways accepted per second, Hello facts/s through each worker, the time from the
last Hello to every effect applied (labels, replays, the outbox published), and each
worker's peak RSS.

A gateway process is this module run as `python -m workers.bench.storm SPEC`: it starts
its gateways, says `ready`, waits for `go` on stdin, runs its clients, prints one JSON
line of figures, and keeps its sessions alive with heartbeats until it is terminated.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass

import asyncpg
import nats

from schemas.subjects import Subjects
from workers.bench.common import (
    BenchTarget,
    bench_target,
    consumer_idle,
    join_herd,
    print_table,
    spawn_workers,
    wait_until,
    worker_env,
)
from workers.bench.costs import peak_rss_mib
from workers.gateway import Code, Gateway, GatewaySettings, HelloRequest, Refused, notices
from workers.runtime.effects import claims
from workers.settings import Settings

HELLO_WORKERS = ("labeler", "liveness", "quarantine", "replay")
CLIENTS_PER_GATEWAY = 64  # each gateway's pending-Hello limit
LEASE_TTL = 60.0  # a gateway process shares 2 cores with everything else here


@dataclass(frozen=True)
class HostSpec:
    """What one gateway process runs: its gateways, and the fleet it is part of."""

    target: BenchTarget
    gateway_ids: tuple[int, ...]
    gateways: int
    nodes: int

    def node_ids(self) -> list[int]:
        """The nodes whose first choice is one of this process's gateways."""
        mine = set(self.gateway_ids)
        return [i for i in range(1, self.nodes + 1) if i % self.gateways in mine]


@dataclass(frozen=True)
class HostFigures:
    first: float  # wall clock: comparable across the processes of one machine
    last: float
    hellos: int
    pushback: int


class _Stream:
    async def deliver(self, dispatch: object) -> None:
        return None

    async def event_ack(self, journal_id: str, seq: int) -> None:
        return None

    async def ack_results(self, command_ids: object) -> None:
        return None

    async def desired_state(self, desired: object) -> None:
        return None

    def drop(self, reason: str, code: str = "") -> None:
        return None


# -- one gateway process --------------------------------------------------------------------
async def host(spec: HostSpec) -> None:
    subjects = Subjects(spec.target.subject_root)
    nc = await nats.connect(spec.target.nats_url, pending_size=256 * 1024 * 1024)
    pools = {
        g: await asyncpg.create_pool(spec.target.database_url, min_size=1, max_size=4)
        for g in spec.gateway_ids
    }
    fleet = {
        g: Gateway(
            f"gw-{g}",
            pools[g],
            nc,
            subjects,
            settings=GatewaySettings(max_streams=max(5000, spec.nodes), lease_ttl=LEASE_TTL),
        )
        for g in spec.gateway_ids
    }
    order = list(spec.gateway_ids)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    try:
        for gateway in fleet.values():
            # its notices consumer, as `bcw provision` makes it (the gateway makes none)
            await notices.provision(nc.jetstream(), subjects, gateway.gateway_id)
            await gateway.start(autotick=1.0)
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "go"
        todo = spec.node_ids()
        todo.reverse()
        pushback = 0

        async def client() -> None:
            nonlocal pushback
            while todo:
                i = todo.pop()
                request = HelloRequest(
                    node_id=f"node-{i}",
                    cert_serial=f"node-serial-{i}",
                    role="worker",
                    boot_id=uuid.uuid4().hex[:8],
                    journal_id="journal-1",
                    capabilities=["cpu", "mem", "nvml", f"rack{i % 40}", "ib"],
                )
                choice = order.index(i % spec.gateways)
                while True:
                    try:
                        await fleet[order[choice % len(order)]].hello(request, _Stream())
                        break
                    except Refused as refused:
                        if refused.code is Code.RESOURCE_EXHAUSTED:
                            pushback += 1
                            await asyncio.sleep(refused.retry_after or 0.1)
                        elif refused.code is Code.UNAVAILABLE:
                            choice += 1  # as a daemon would: another gateway
                        else:
                            raise

        async def heartbeats() -> None:
            """The daemons' heartbeats, every 5 s (the sessions must stay alive)."""
            while True:
                await asyncio.sleep(5)
                for gateway in fleet.values():
                    for session in list(gateway.sessions.values()):
                        gateway.heartbeat(session.node_id, session.epoch)

        beating = asyncio.create_task(heartbeats())
        hellos = len(todo)
        first = time.time()
        await asyncio.gather(*(client() for _ in range(len(fleet) * CLIENTS_PER_GATEWAY)))
        figures = HostFigures(first, time.time(), hellos, pushback)
        print(json.dumps(asdict(figures)), flush=True)
        await stopping.wait()
        beating.cancel()
    finally:
        for gateway in fleet.values():
            await gateway.stop(graceful=False)
        for pool in pools.values():
            await pool.close()
        await nc.close()


# -- the bench ----------------------------------------------------------------------------
async def _spawn_hosts(
    target: BenchTarget, nodes: int, gateways: int, processes: int
) -> list[asyncio.subprocess.Process]:
    hosts = []
    for p in range(processes):
        ids = tuple(g for g in range(gateways) if g % processes == p)
        spec = {"target": asdict(target), "gateway_ids": ids, "gateways": gateways, "nodes": nodes}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers.bench.storm",
            json.dumps(spec),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        hosts.append(process)
    return hosts


async def _line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    line = await process.stdout.readline()
    if not line:
        raise RuntimeError(f"gateway process {process.pid} ended (exit {await process.wait()})")
    return line.decode().strip()


async def run(
    settings: Settings, nodes: int, gateways: int, embedded: bool, processes: int = 4
) -> int:
    processes = max(1, min(processes, gateways))
    async with bench_target(settings, embedded) as target:
        subjects = Subjects(target.subject_root)
        conn = await asyncpg.connect(target.database_url)
        print(f"joining {nodes:,} nodes, one command in flight each ...")
        await join_herd(conn, nodes)
        procs = await spawn_workers(worker_env(target))
        hosts = await _spawn_hosts(target, nodes, gateways, processes)
        nc = await nats.connect(target.nats_url)
        clock = time.time() - time.monotonic()  # monotonic → wall clock
        try:
            for process in hosts:
                if (said := await _line(process)) != "ready":
                    raise RuntimeError(f"gateway process {process.pid} said {said!r}")
            await asyncio.sleep(2.0)  # workers provisioned and bound
            print(
                f"power-on: {nodes:,} Hellos over {gateways} gateways in {processes} processes ..."
            )
            for process in hosts:
                assert process.stdin is not None
                process.stdin.write(b"go\n")
                await process.stdin.drain()
            figures = [HostFigures(**json.loads(await _line(process))) for process in hosts]
            first = min(f.first for f in figures)
            last = max(f.last for f in figures)
            js = nc.jetstream()
            done = {}
            for name in HELLO_WORKERS:

                async def idle(name: str = name) -> bool:
                    return await consumer_idle(js, subjects.facts_stream, name)

                done[name] = await wait_until(idle) + clock
            labels_sql = "SELECT count(*) FROM node_labels WHERE source = 'system'"
            replay_sql = (
                "SELECT count(*) FROM commands WHERE session_epoch = 1 AND delivery_attempt = 2"
            )

            async def effects() -> bool:
                return (
                    await conn.fetchval(labels_sql) == 5 * nodes
                    and await conn.fetchval(replay_sql) == nodes
                    and (await claims.waiting(conn, None))[0] == 0
                )

            settled = await wait_until(effects) + clock
            rss = {name: peak_rss_mib(proc.pid) for name, proc in procs.items()}
        finally:
            for process in [*hosts, *procs.values()]:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            await asyncio.gather(*(p.wait() for p in [*hosts, *procs.values()]))
            await nc.close()
            await conn.close()
    pushback = sum(f.pushback for f in figures)
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
        f"bcw bench storm: {nodes:,} nodes over {gateways} gateways in {processes} processes",
        ("measure", "value"),
        rows,
    )
    return 0


def _main(argv: list[str]) -> None:
    raw = json.loads(argv[1])
    spec = HostSpec(
        target=BenchTarget(**raw["target"]),
        gateway_ids=tuple(raw["gateway_ids"]),
        gateways=raw["gateways"],
        nodes=raw["nodes"],
    )
    asyncio.run(host(spec))


if __name__ == "__main__":
    _main(sys.argv)

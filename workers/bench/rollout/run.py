"""`bcw bench rollout`: N sessions over G reference gateways held in the steady state
(every gateway flushing every flush period, the five workers in `bcw run` processes),
then every gateway drained, P at a time, its daemons redialling the others with real
Hellos, while C commands stay in flight; a line every `every` seconds and the last line
once the last gateway is back and every command has ended (`tally`)."""

from __future__ import annotations

import asyncio
import math
import random
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path

import asyncpg
import nats

from schemas.subjects import Subjects
from workers.bench.common import (
    bench_target,
    spawn_workers,
    stop_workers,
    wait_until,
    worker_env,
    workers_bound,
)
from workers.bench.rollout import gateways as gws
from workers.bench.rollout import plan, statements, tally
from workers.bench.rollout.backends import BackendCpu
from workers.bench.rollout.daemons import Daemons
from workers.bench.rollout.watch import Processes, RolloutWatch
from workers.bench.steady import fleet
from workers.bench.steady.run import FACTS_MAX_AGE, SHARED_BUFFERS, START_GRACE
from workers.liveness.sight import switched_on
from workers.registry import WORKERS
from workers.settings import Settings

#: a wave's sessions are all welcomed elsewhere within this, or the run goes on without
WAVE_WITHIN = 600.0
#: how the bench's own connections (its lines and watch) show in pg_stat_activity
WATCHING = {"application_name": "bench: watch"}
#: seconds between a wave's first commands and its drain: dispatched and running by then
RUNNING_BEFORE_DRAIN = 2.0
COMMANDS = """
SELECT count(*) FILTER (WHERE state = 'done') AS done,
       count(*) FILTER (WHERE state IN ('failed', 'cancelled')) AS failed
  FROM commands
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rollout:
    """The run's state between its steps."""

    def __init__(self, gateways: int) -> None:
        self.n_gateways = gateways
        self.done_gateways = 0
        self.closed = 0  # sessions the drained gateways closed
        self.enqueued = 0
        #: when the last line was taken: (monotonic, CPU by process, Welcomes, reconnects)
        self.last: tuple[float, dict[str, float], int, int] | None = None


async def run(
    settings: Settings,
    nodes: int,
    gateways: int,
    parallel: int,
    commands: int,
    minutes_after: float,
    embedded: bool,
    hold: float = 60.0,
    every: float = 60.0,
    seed: int = 1,
    work: tuple[float, float] = (5.0, 30.0),
    stop_after: float | None = None,
) -> int:
    """The rollout; `stop_after` (minutes): no wave is drained once the rollout has
    lasted that long — the gateways rolled by then are counted, the rest said not rolled
    (a fleet this machine cannot roll whole in an hour is measured for as long as wanted)."""
    waves = plan.waves(gateways, parallel)
    gw_settings = gws.settings()
    if plan.capacity_left(nodes, gateways, parallel, gw_settings.max_streams) < 0:
        print(f"bcw bench rollout: {nodes} nodes do not fit on {gateways - parallel} gateways")
        return 2
    rng = random.Random(seed)
    server = {"shared_buffers": SHARED_BUFFERS, **statements.SERVER}
    async with bench_target(
        settings, embedded, facts_max_age=FACTS_MAX_AGE, postgres=server
    ) as target:
        subjects = Subjects(target.subject_root)
        conn = await asyncpg.connect(target.database_url, server_settings=WATCHING)
        print(f"making {nodes:,} sessions on {gateways} gateways ...", flush=True)
        daemons_ = gws.daemons(nodes, seed, work)
        ranged = await switched_on(conn, settings.liveness.range_sight)
        await fleet.prepare(conn, nodes, gateways, ranged)
        await gws.enroll(conn, daemons_)
        await gws.established(conn, nodes, daemons_[0])
        await conn.execute("VACUUM (ANALYZE) node_sessions")
        await conn.execute(
            "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), "
            f"grace_until = compute_now() + interval '{START_GRACE}'"
        )
        logs = Path(tempfile.mkdtemp(prefix="bcw-rollout-"))
        replicas = max(1, math.ceil(nodes / 500_000))
        ports = [_free_port() for _ in range(replicas)]
        procs: dict[str, asyncio.subprocess.Process] = {}
        for k, port in enumerate(ports):
            env = {**worker_env(target), "BCW_HEALTH_PORT": str(port)}
            spawned = await spawn_workers(env, logs, names=["liveness"], tag=f"{k + 1}-")
            procs[f"liveness-{k + 1}"] = spawned["liveness"]
        others = [w for w in WORKERS if w != "liveness"]
        procs |= await spawn_workers(worker_env(target), logs, names=others)
        nc = await nats.connect(target.nats_url, pending_size=256 * 2**20)
        pools = await gws.pools(target.database_url)
        watch = RolloutWatch()
        for kind in ("node.disconnected", "node.connected", "gateway.blind", "gateway.seeing"):
            await nc.subscribe(subjects.event(kind), cb=watch.event)
        stopping = asyncio.Event()
        tasks: list[asyncio.Task[object]] = []
        state = Rollout(gateways)
        up: list[gws.RolloutGateway] = []
        try:
            await wait_until(lambda: workers_bound(nc.jetstream(), subjects), within=120)
            for g in range(gateways):
                gateway = await gws.made(pools, nc, subjects, f"gw-{g}", gw_settings)
                gateway.on_publish = watch.publish
                up.append(gateway)
            gws.attach(up, daemons_, gw_settings.credits)
            fleet_ = Daemons(daemons_, up)  # type: ignore[arg-type]
            for gateway in up:  # each ticks itself from here: lease, flush
                await gateway.start()
            watcher = await asyncpg.connect(target.database_url, server_settings=WATCHING)
            by_client = BackendCpu()
            tasks += [
                asyncio.create_task(
                    by_client.follow(
                        await asyncpg.connect(target.database_url, server_settings=WATCHING)
                    )
                ),
                asyncio.create_task(fleet_.run(stopping)),
                asyncio.create_task(watch.inbox(watcher)),
                asyncio.create_task(watch.sweeps_of(ports)),
            ]
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            processes = Processes(procs, target.nats_url, backend)
            print(
                f"holding {nodes:,} nodes on {gateways} gateways ({replicas} liveness "
                f"process(es), proof at require); {hold:g} s of steady state measured, then "
                f"{len(waves)} wave(s) of {parallel} (logs: {logs})",
                flush=True,
            )
            lines: list[tally.Line] = []
            begin = time.monotonic() + hold
            counter = await asyncpg.connect(target.database_url, server_settings=WATCHING)
            printer = asyncio.create_task(
                _lines(counter, processes, watch, fleet_, state, lines, every, begin)
            )
            tasks.append(printer)
            cpu_before = processes.cpu()
            await asyncio.sleep(hold)
            cpu_start = processes.cpu()
            counting = await statements.start(conn)
            by_client.reset()
            steady_cores = sum(cpu_start[k] - cpu_before[k] for k in cpu_start) / hold
            started = time.monotonic()
            shares = plan.spread(commands, len(waves))
            for wave, share in zip(waves, shares, strict=True):
                if stop_after is not None and time.monotonic() - started >= 60.0 * stop_after:
                    print(f"  stopped after {stop_after:g} min: no wave more", flush=True)
                    break
                await _roll(
                    conn,
                    pools,
                    nc,
                    subjects,
                    gw_settings,
                    up,
                    fleet_,
                    watch,
                    state,
                    wave,
                    share,
                    rng,
                )
            try:
                await wait_until(lambda: _ended(conn, state.enqueued), within=WAVE_WITHIN)
            except TimeoutError:  # said as lost
                print(f"  commands not ended {WAVE_WITHIN:.0f} s after the last wave", flush=True)
            seconds = time.monotonic() - started
            cpu_end = processes.cpu()
            spent = sum(cpu_end[k] - cpu_start[k] for k in cpu_end)
            clients = by_client.lines(seconds, len(fleet_.reconnects))
            by_statement = await statements.top(conn, len(fleet_.reconnects)) if counting else []
            await asyncio.sleep(60.0 * minutes_after)
            await asyncio.sleep(2.0)  # the last events through the relays
            printer.cancel()
            await _line(counter, processes, watch, fleet_, state, lines, begin)
            left_open = await conn.fetchval(
                "SELECT count(*) FROM node_sessions WHERE gateway_id IS NULL"
            )
            counts = await conn.fetchrow(COMMANDS)
        finally:
            stopping.set()
            for task in tasks:
                task.cancel()
            for failed in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(failed, Exception):
                    print(f"bcw bench rollout: a task failed: {failed!r}", flush=True)
            for gateway in up:
                await gateway.stop(graceful=False)
            await stop_workers(procs)
            await pools.close()
            await nc.close()
        await conn.close()
    slopes, notes = tally.rss_slopes(processes.rss_samples, warm_s=hold + 60.0)
    final = tally.Final(
        gateways=gateways,
        nodes=nodes,
        minutes=seconds / 60.0,
        reconnects=fleet_.reconnects,
        lags=watch.all_lags,
        blind=len(watch.blind),
        wrong=max(len(watch.wrong), left_open),
        duplicates=watch.duplicates,
        lost=state.enqueued - counts["done"],
        commands=state.enqueued,
        twice=tally.run_twice(fleet_.runs()),
        cores=spent / seconds,
        hello_ms=tally.hello_ms(spent, seconds, steady_cores, len(fleet_.reconnects)),
        moved=len(fleet_.reconnects),
        sessions=state.closed,
        rss_slopes=slopes,
        notes=notes,
        rolled=None if state.done_gateways >= gateways else state.done_gateways,
    )
    broken = tally.problems(final)
    for line in broken:
        print(f"BOUND BROKEN: {line}")
    errors = [f"daemons' dials or ticks failed: {dict(fleet_.errors)}"] if fleet_.errors else []
    refused: Counter[str] = Counter()
    for daemon in fleet_.all:
        refused.update(daemon.refusals)
    moved = max(1, len(fleet_.reconnects))
    refusals = [
        f"Hellos refused: {sum(refused.values()):,} ({sum(refused.values()) / moved:.1f} a "
        f"session moved), by code {dict(refused)}"
    ]
    if fleet_.stale:
        errors.append(f"sessions drained gateways held for daemons gone: {fleet_.stale}")
    for line in (
        *watch.blind_why,
        *errors,
        *notes,
        *refusals,
        *by_statement,
        *clients,
        f"steady state before the rollout: {steady_cores:.2f} cores",
    ):
        print(line)
    print(final.last_line(), flush=True)
    return 1 if broken else 0


async def _roll(
    conn: asyncpg.Connection,
    pools: gws.Pools,
    nc: nats.NATS,
    subjects: Subjects,
    gw_settings: gws.GatewaySettings,
    up: list[gws.RolloutGateway],
    fleet_: Daemons,
    watch: RolloutWatch,
    state: Rollout,
    wave: list[int],
    share: int,
    rng: random.Random,
) -> None:
    """One wave: commands to its gateways' nodes (half a moment before the drain: running
    when it comes; half as it starts: pending or dispatched), the drain, every session
    welcomed elsewhere, the gateways back empty."""
    draining = [up[g] for g in wave]
    nodes = [n for g in draining for n in g.sessions]
    first, second = plan.spread(share, 2)
    await _enqueue(conn, nodes, first, rng, state)
    await asyncio.sleep(RUNNING_BEFORE_DRAIN)
    for gateway in draining:
        fleet_.draining.add(gateway.gateway_id)
        watch.drained.add(gateway.gateway_id)
        await gateway.drain()  # refuses new Hellos, UNAVAILABLE
    await _enqueue(conn, nodes, second, rng, state)
    for gateway in draining:
        state.closed += fleet_.leave(gateway)
        await gateway.stop()  # closes each session, gateway-shutdown; gives its lease up

    async def moved() -> bool:
        return not any(fleet_.away[g.gateway_id] for g in draining)

    try:
        await wait_until(moved, within=WAVE_WITHIN)
    except TimeoutError:
        stuck = sorted(n for g in draining for n in fleet_.away[g.gateway_id])
        said = [fleet_.by_node[n].state() for n in stuck[:5]]
        print(f"  {len(stuck)} session(s) not welcomed elsewhere, e.g. {said}", flush=True)
    for g, gateway in zip(wave, draining, strict=True):  # back, empty, taking new sessions
        again = await gws.started(pools, nc, subjects, gateway.gateway_id, gw_settings)
        again.on_publish = watch.publish
        up[g] = again
        fleet_.draining.discard(gateway.gateway_id)
        state.done_gateways += 1


async def _enqueue(
    conn: asyncpg.Connection, nodes: list[str], count: int, rng: random.Random, state: Rollout
) -> None:
    if count <= 0 or not nodes:
        return
    chosen = [rng.choice(nodes) for _ in range(count)]
    await conn.execute(
        "SELECT enqueue_command(n, 'exec', '{}', 'default') FROM unnest($1::text[]) n", chosen
    )
    state.enqueued += count


async def _ended(conn: asyncpg.Connection, commands: int) -> bool:
    row = await conn.fetchrow(COMMANDS)
    return bool(row["done"] + row["failed"] >= commands)


async def _lines(
    conn: asyncpg.Connection,
    processes: Processes,
    watch: RolloutWatch,
    fleet_: Daemons,
    state: Rollout,
    lines: list[tally.Line],
    every: float,
    begin: float,
) -> None:
    while True:
        await asyncio.sleep(every)
        await _line(conn, processes, watch, fleet_, state, lines, begin)


async def _line(
    conn: asyncpg.Connection,
    processes: Processes,
    watch: RolloutWatch,
    fleet_: Daemons,
    state: Rollout,
    lines: list[tally.Line],
    begin: float,
) -> None:
    now, cpu = time.monotonic(), processes.cpu()
    then, cpu_then, welcomes, reconnected = state.last or (processes.started, {}, 0, 0)
    state.last = (now, cpu, fleet_.welcomes, len(fleet_.reconnects))
    dt = max(1e-9, now - then)
    sweeps, watch.sweeps = watch.sweeps, []
    counts = await conn.fetchrow(COMMANDS)
    line = tally.Line(
        at=now - begin,
        gateways_done=state.done_gateways,
        gateways=state.n_gateways,
        moved=len(fleet_.reconnects),
        hellos_per_s=(fleet_.welcomes - welcomes) / dt,
        reconnects=fleet_.reconnects[reconnected:],
        lags=watch.take_lags(),
        sweep_max=max(sweeps, default=math.nan),
        blind=len(watch.blind),
        expected=len(watch.expected),
        wrong=len(watch.wrong),
        duplicates=watch.duplicates,
        done=counts["done"],
        lost=counts["failed"],
        twice=tally.run_twice(fleet_.runs()),
        commands=state.enqueued,
        cores={k: (cpu[k] - cpu_then.get(k, cpu[k])) / dt for k in cpu},
        rss=processes.rss(),
    )
    print(line.line(), flush=True)
    lines.append(line)

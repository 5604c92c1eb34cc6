"""`bcw demo`: the whole flow on one machine, with no services installed.

Starts nats-server and PostgreSQL from their wheels, migrates, provisions, runs the five
workers in this process, runs the `mixed` scenario of the simulator on a fleet (1,000
nodes over 3 gateways by default) with live progress, and ends with a table of checks
against the rules. Exit 0 only if every check holds. Called by `make demo`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from rich.console import Console
from rich.live import Live
from rich.table import Table

from schemas.subjects import Subjects
from workers.demo import stuck
from workers.embedded.servers import EmbeddedNats, EmbeddedPostgres, embedded_servers
from workers.liveness.settings import LivenessSettings
from workers.registry import WORKERS
from workers.replay.settings import ReplaySettings
from workers.runtime.base.runtime_settings import (
    ConsumerSettings,
    DatabaseSettings,
    NatsSettings,
    OutboxSettings,
)
from workers.runtime.base.waiting import stop_on_signals
from workers.runtime.bus import principals, streams
from workers.runtime.observability import sql, tracing
from workers.runtime.process import run_process
from workers.runtime.store import migrate
from workers.settings import Settings
from workers.sim import SCENARIOS, Check, Simulator

#: wall seconds the scenario may take (about 50 on a 2-core machine, 70 on a loaded one)
#: before the demo gives up and prints what it waits for
SCENARIO_BUDGET = 240.0


def demo_settings(nats_url: str, database_url: str, root: str) -> Settings:
    """The workers' settings for a simulated fleet whose time runs up to 10x faster."""
    return Settings(
        subject_root=root,
        health_port=0,
        log_level="WARNING",
        database=DatabaseSettings(url=database_url, pool_max=10, command_timeout=20),
        nats=NatsSettings(url=nats_url),
        consumer=ConsumerSettings(ack_wait=30),
        outbox=OutboxSettings(poll_seconds=0.5),
        liveness=LivenessSettings(sweep_interval=0.5),
        replay=ReplaySettings(dispatch_interval=0.2, lease_ttl=timedelta(seconds=15)),
    )


def _table(checks: list[Check], elapsed: float) -> Table:
    table = Table(title=f"bcw demo: checks against the rules ({elapsed:.0f} s)")
    for column in ("check", "expected", "actual", ""):
        table.add_column(column)
    for c in checks:
        table.add_row(c.name, c.expected, c.actual, "[green]ok[/]" if c.ok else "[red]FAIL[/]")
    return table


async def main(
    directory: Path,
    *,
    hold: bool = False,
    nodes: int = 1000,
    gateways: int = 3,
    otlp: str | None = None,
    durable: bool = False,
    scenario: str = "mixed",
) -> int:
    console = Console()
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    if otlp:  # the workers and the gateways export their spans there (OTEL_* as usual)
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp
    gateway_provider = tracing.build_provider("bcw-gateway")
    trace.set_tracer_provider(gateway_provider)  # the simulator's gateways trace with it
    (directory / "env").unlink(missing_ok=True)  # a killed demo's: its servers are gone
    with embedded_servers(directory, durable=durable) as (nats_server, postgres):
        synced = "sync_interval: always" if durable else "flushed every 2 min (--durable: always)"
        console.print(f"NATS (JetStream)  {nats_server.url}  ({synced})")
        console.print(f"PostgreSQL        {postgres.url}  (fsync {'on' if durable else 'off'})")
        conn = await asyncpg.connect(postgres.url)
        try:
            await migrate.migrate(conn)
            # its simulated daemons prove their Hellos: the demo runs as a fleet should
            await migrate.set_hello_proof(conn, "require")
            await conn.execute(
                "TRUNCATE nodes, gateways, outbox, outbox_packs, processed_facts, controller_leases, "
                "liveness_ranges CASCADE"
            )
            await conn.execute(
                "UPDATE liveness_sweeps SET last_sweep_at = NULL, grace_until = NULL"
            )
        finally:
            await conn.close()
        settings = demo_settings(nats_server.url, postgres.url, "bc")
        subjects = Subjects(settings.subject_root)
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        for stream in (
            subjects.facts_stream,
            subjects.events_stream,
            subjects.gateway_stream,
            subjects.dead_stream,
            *map(subjects.dead_stream_of, principals.dead_publishers()),
        ):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)  # a demo starts from a clean bus
        await streams.provision_streams(js, subjects)
        console.print(f"workers           {', '.join(sorted(WORKERS))} (one process)")
        stopping = asyncio.Event()
        workers_task = asyncio.create_task(
            run_process(
                settings, [build(settings) for build in WORKERS.values()], stopping=stopping
            )
        )
        # the gateways' SQL (the Hello transaction's) whenever their spans are exported
        gateway_tracer = tracing.tracer(gateway_provider)
        sql_spans = (
            sql.SqlSpans(gateway_tracer, settings.trace_query_text).install
            if tracing.is_recording(gateway_tracer)
            else None
        )
        pool = await asyncpg.create_pool(postgres.url, min_size=2, max_size=8, init=sql_spans)
        sim = Simulator(pool, nc, subjects, nodes=nodes, gateways=gateways, prefix="node")
        checks: list[Check] = []
        try:
            await asyncio.sleep(1.0)  # workers provisioned and consuming
            await fresh_sweep_history(pool)
            await sim.start()
            # on a terminal one line, updated; in a log each phase once, as it begins
            live = Live(console=console, refresh_per_second=4) if console.is_terminal else None
            with live or contextlib.nullcontext():
                shown = ""

                def show(phase: str) -> None:
                    nonlocal shown
                    line = f"[bold]{phase}[/] · {time.monotonic() - started:.0f} s · sim clock +{sim.clock.offset:.0f} s"
                    if live is not None:
                        live.update(line)
                    elif phase != shown:
                        shown = phase
                        console.print(line)

                sim.progress = show
                checks = await _watched(SCENARIOS[scenario](sim), workers_task, sim, console)
            if checks:
                console.print(_table(checks, time.monotonic() - started))
            if hold:
                await sim.stop(graceful=True)  # its fleet ends; servers and workers stay
                print(kept_up(nats_server, postgres, os.getpid()), flush=True)  # unwrapped
                # for a shell (`. .bcw/demo/env`): written once everything is up, gone after
                env_file = directory / "env"
                env_file.write_text(exports(nats_server, postgres) + "\n")
                try:
                    await _wait_for_signal()
                finally:
                    env_file.unlink(missing_ok=True)
        finally:
            await sim.stop()
            stopping.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(workers_task, 15)
            await pool.close()
            await nc.close()
            if isinstance(gateway_provider, TracerProvider):
                gateway_provider.shutdown()  # exports what is left
    if otlp:
        console.print(
            f"traces exported to {otlp}; with --keep, `bcw explain NODE` shows a node's trace ids"
        )
    ok = bool(checks) and all(c.ok for c in checks)
    console.print("[green]all checks hold[/]" if ok else "[red]some checks failed[/]")
    return 0 if ok else 1


def kept_up(nats_server: EmbeddedNats, postgres: EmbeddedPostgres, workers_pid: int) -> str:
    """What `bcw demo --keep` leaves running, and how to reach it."""
    nats_pid = nats_server.process.pid if nats_server.process else "?"
    postgres_pid = postgres.process.pid if postgres.process else "?"
    return "\n".join(
        [
            "kept up until Ctrl-C (the simulated fleet has stopped; its history stays):",
            f"  NATS (JetStream)  {nats_server.url}  pid {nats_pid}",
            f"  PostgreSQL        {postgres.url}  pid {postgres_pid}",
            f"  workers           {', '.join(sorted(WORKERS))}, in this process, pid {workers_pid}",
            exports(nats_server, postgres),
        ]
    )


def exports(nats_server: EmbeddedNats, postgres: EmbeddedPostgres) -> str:
    """The shell line that points `bcw` at the demo's servers."""
    return f"export BCW_NATS_URL={nats_server.url} BCW_DATABASE_URL={postgres.url}"


async def _watched(
    scenario: Awaitable[list[Check]],
    workers_task: asyncio.Task[Any],
    sim: Simulator,
    console: Console,
) -> list[Check]:
    """The scenario's checks; none if the workers stop first or it overruns
    `SCENARIO_BUDGET` — then what everything waits for is printed (`stuck.report`)."""
    running = asyncio.ensure_future(scenario)
    done, _ = await asyncio.wait(
        {running, workers_task}, timeout=SCENARIO_BUDGET, return_when=asyncio.FIRST_COMPLETED
    )
    if running in done:
        return running.result()
    if workers_task in done:
        error = workers_task.exception() if not workers_task.cancelled() else None
        console.print(f"[red]the workers stopped before the scenario ended: {error!r}[/]")
    else:
        console.print(f"[red]the scenario did not end within {SCENARIO_BUDGET:.0f} s[/]")
        for line in await stuck.report(sim.pool, sim.nc.jetstream(), sim.subjects.facts_stream):
            console.print(line, markup=False, highlight=False)
    await stuck.cancel(running)
    return []


async def fresh_sweep_history(pool: asyncpg.Pool) -> None:
    """A fresh install has no sweep history: start it now, not with an outage grace."""
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), grace_until = NULL"
        )


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    await stop.wait()

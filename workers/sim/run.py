"""`bcw sim`: one scenario against the NATS and PostgreSQL of the environment (the
workers run elsewhere: `bcw run all`, or the chart). Prints the checks; exit 0 if all hold.

It moves `compute_now()` only when told the database is a simulation database
(`--own-clock`), and refuses that (exit 2) while the database holds a session no
simulator created: moving the clock would age it, expire every lease and sweep real
nodes as silent. Otherwise the scenario runs in real time: longer, and harmless.

Its gateways trace as `bcw-gateway` (their Hello spans, the Hello transaction's SQL, the
fact publishes) from the standard `OTEL_*` variables, as the workers do: with
`OTEL_EXPORTER_OTLP_ENDPOINT` set, a Hello against `bcw run` workers is one trace."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace
from rich.console import Console
from rich.table import Table

from schemas.subjects import Subjects
from workers.runtime.base.errors import SettingError
from workers.runtime.bus import connection, server, streams
from workers.runtime.observability import sql, tracing
from workers.runtime.store import db
from workers.settings import Settings
from workers.sim.scenarios import SCENARIOS
from workers.sim.simulator import Simulator, foreign_sessions


async def run_scenario(
    settings: Settings, scenario: str, nodes: int, gateways: int, seed: int, own_clock: bool
) -> int:
    subjects = Subjects(settings.subject_root)
    provider = tracing.build_provider("bcw-gateway")  # SettingError: a bad OTEL_*
    trace.set_tracer_provider(provider)  # the simulator's gateways trace with it
    tracer = tracing.tracer(provider)
    traced = tracing.is_recording(tracer)
    try:
        return await _run(
            settings,
            subjects,
            scenario,
            nodes,
            gateways,
            seed,
            own_clock,
            (sql.SqlSpans(tracer, settings.trace_query_text).install if traced else None),
        )
    finally:
        shutdown = getattr(provider, "shutdown", None)
        if shutdown is not None:
            shutdown()  # what is left is exported


async def _run(
    settings: Settings,
    subjects: Subjects,
    scenario: str,
    nodes: int,
    gateways: int,
    seed: int,
    own_clock: bool,
    sql_spans: Callable[[Any], Awaitable[None]] | None,
) -> int:
    console = Console()
    pool = await db.create_pool(
        settings.database.model_copy(update={"pool_min": 2, "pool_max": 8}), init=sql_spans
    )  # a failure names BCW_DATABASE_URL
    async with pool.acquire() as conn:
        foreign, example = await foreign_sessions(conn)
    if own_clock and foreign:
        await pool.close()
        raise SettingError(
            "--own-clock",
            f"refused: the database holds {foreign} session(s) no simulator created "
            f"(e.g. {example}), which moving compute_now() would age; run without it (real "
            "time) or on a database of its own",
        )
    if not own_clock:
        console.print(
            "running in real time: compute_now() is not moved on a database the simulator "
            "does not own (--own-clock on a simulation database makes it faster)"
        )
    nc = await connection.connect(settings.nats, name="bcw sim")
    sourced = await streams.gateways_sourced(nc.jetstream(), subjects)
    if sourced:
        await nc.close()
        await pool.close()
        raise SettingError(
            "BCW_SUBJECT_ROOT",
            f"refused: {subjects.facts_stream} takes its facts from each listed gateway's own "
            f"stream ({len(sourced)}, BCW_NATS_FACTS_GATEWAYS), and the simulator's gateways "
            "would have none: run it under a subject root of its own",
        )
    prefix = f"sim{uuid.uuid4().hex[:6]}"
    sim = Simulator(
        pool,
        nc,
        subjects,
        nodes=nodes,
        gateways=gateways,
        seed=seed,
        prefix=prefix,
        owns_clock=own_clock,
    )
    try:
        await streams.provision_streams(
            nc.jetstream(),
            subjects,
            settings.nats.stream_replicas,
            streams.limits_of(settings.nats, server.server_version(nc)),
        )
        await sim.start()
        sim.progress = lambda phase: console.log(phase)
        checks = await SCENARIOS[scenario](sim)
    finally:
        await sim.stop(graceful=True)  # the run's sessions end now, not by gateway loss
        await pool.close()
        await nc.close()
    table = Table(title=f"bcw sim {scenario}: {nodes} nodes ({prefix}-*) over {gateways} gateways")
    for column in ("check", "expected", "actual", ""):
        table.add_column(column)
    for c in checks:
        table.add_row(c.name, c.expected, c.actual, "ok" if c.ok else "FAIL")
    console.print(table)
    return 0 if all(c.ok for c in checks) else 1

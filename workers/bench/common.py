"""What the benchmarks share: servers (given, or embedded for the run), a fresh migrated
database, a fresh subject root, and a printed table."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import asyncpg
from nats.js import JetStreamContext

from schemas import REGISTRY, Fact, Hello
from schemas.subjects import Subjects
from workers.bench.costs import cpu_seconds
from workers.embedded.servers import EmbeddedNats, EmbeddedPostgres, die_with_parent
from workers.runtime.base.runtime_settings import ConsumerSettings
from workers.runtime.effects.worker import Worker
from workers.runtime.store import migrate
from workers.settings import Settings


@dataclass(frozen=True)
class BenchTarget:
    nats_url: str
    database_url: str
    subject_root: str


@contextlib.asynccontextmanager
async def bench_target(
    settings: Settings,
    embedded: bool,
    sync_always: bool = False,
    facts_max_age: float | None = None,
    postgres: dict[str, str] | None = None,
) -> AsyncIterator[BenchTarget]:
    """Servers for one benchmark run, and a scratch database dropped afterwards (at `warn`:
    a Hello proves its node only where the bench gave the node a key).
    `sync_always`: the embedded nats-server syncs each message before its PubAck;
    `facts_max_age`: the facts stream keeps a fact this long (seconds), not a day;
    `postgres`: settings of the embedded PostgreSQL (`shared_buffers`, say)."""
    stack = contextlib.ExitStack()
    if embedded:
        base = Path(tempfile.mkdtemp(prefix="bcw-bench-"))
        stack.callback(shutil.rmtree, base, True)  # runs last: after the servers stopped
        nats = stack.enter_context(_started(EmbeddedNats(base / "nats", sync_always=sync_always)))
        database = EmbeddedPostgres(base / "postgres", settings=dict(postgres or {}))
        nats_url, admin_url = nats.url, stack.enter_context(_started(database)).url
    else:
        nats_url, admin_url = settings.nats.url, settings.database.url.get_secret_value()
    name = f"bcw_bench_{uuid.uuid4().hex[:8]}"
    with stack:
        admin = await asyncpg.connect(admin_url)
        await admin.execute(f'CREATE DATABASE "{name}"')
        database_url = admin_url.rsplit("/", 1)[0] + "/" + name
        try:
            conn = await asyncpg.connect(database_url)
            try:
                await migrate.migrate(conn)
                # its daemons prove their Hellos only where a bench measures proofs (each
                # enrolls the keys it proves by): the rest say Hello as nodes without a key
                await migrate.set_hello_proof(conn, "warn")
            finally:
                await conn.close()
            target = BenchTarget(nats_url, database_url, f"bench{uuid.uuid4().hex[:6]}")
            await _provision(target, facts_max_age)
            yield target
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()


async def _provision(target: BenchTarget, facts_max_age: float | None = None) -> None:
    import nats

    from schemas.subjects import Subjects
    from workers.runtime.bus import streams

    limits = None if facts_max_age is None else streams.StreamLimits(facts_age=facts_max_age)
    nc = await nats.connect(target.nats_url)
    try:
        await streams.provision_streams(
            nc.jetstream(), Subjects(target.subject_root), limits=limits
        )
    finally:
        await nc.close()


@contextlib.contextmanager
def _started(server: EmbeddedNats | EmbeddedPostgres):  # type: ignore[no-untyped-def]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def print_table(title: str, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(title)
    for row in [header, *rows]:
        print(
            "  "
            + "  ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True))
        )


async def join_fleet(
    database_url: str, nodes: int, prefix: str = "node-", gateways: int = 1
) -> None:
    """`nodes` joined nodes with sessions at epoch 1 spread over `gateways` gateways."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "SELECT join_node($1 || i, 'worker', $1 || 'serial-' || i, NULL) FROM generate_series(1, $2) i",
            prefix,
            nodes,
        )
        await conn.execute(
            """
            UPDATE node_sessions SET session_epoch = 1, boot_id = 'boot-1', journal_id = 'journal-1',
                   gateway_id = 'gw-' || (abs(hashtext(node_id)) % $1), connected_at = compute_now(),
                   last_seen = compute_now()
            """,
            gateways,
        )
    finally:
        await conn.close()


async def publish_facts(
    nats_url: str, subjects_facts: list[tuple[str, bytes, dict[str, str]]]
) -> None:
    """Publish (subject, body, headers) pipelined, 2,000 PubAcks in flight at most."""
    import nats

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        pending = []
        for subject, body, headers in subjects_facts:
            pending.append(await js.publish_async(subject, body, headers=headers))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await nc.close()


async def consume_and_relay(
    target: BenchTarget,
    worker: Worker,
    expected: int,
    settings: ConsumerSettings | None = None,
    *,
    drain: bool = False,
    relay: bool = True,
) -> tuple[float, float]:
    """Seconds until `expected` facts are settled, and (with `drain`) until the outbox
    they filled is published too: by a relay in this process, or (`relay=False`) by
    whatever relays the same database elsewhere."""
    import nats
    from opentelemetry import trace

    from schemas.subjects import Subjects
    from workers.runtime.base.runtime_settings import DatabaseSettings, OutboxSettings
    from workers.runtime.bus import streams
    from workers.runtime.effects.consumer import FactConsumer
    from workers.runtime.effects.outbox import OutboxRelay
    from workers.runtime.observability.metrics import Metrics

    subjects = Subjects(target.subject_root)
    settings = settings or ConsumerSettings(max_ack_pending=4096)
    nc = await nats.connect(target.nats_url, pending_size=64 * 1024 * 1024)
    from workers.runtime.store import db

    pool = await db.create_pool(DatabaseSettings(url=target.database_url, pool_min=2, pool_max=4))
    metrics = Metrics()
    stopping = asyncio.Event()
    try:
        js = nc.jetstream()
        await streams.ensure_consumer(
            js, subjects.facts_stream, worker.consumer_spec(subjects), settings
        )
        relayer = OutboxRelay(
            pool,
            js,
            OutboxSettings(batch_size=1000),
            DatabaseSettings(url=target.database_url),
            metrics,
            trace.NoOpTracer(),
            subjects,
        )
        consumer = FactConsumer(
            worker,
            nc=nc,
            js=js,
            pool=pool,
            subjects=subjects,
            settings=settings,
            metrics=metrics,
            tracer=trace.NoOpTracer(),
            on_outbox_rows=relayer.wake,
        )
        await consumer.bind()
        started = time.perf_counter()
        tasks = [asyncio.create_task(consumer.run(stopping))]
        if relay:
            tasks.append(asyncio.create_task(relayer.run(stopping)))

        def settled_facts() -> float:
            return sum(v for k, v in metrics.facts.by_labels().items() if k[0] == worker.name)

        # a read collects the whole registry (/proc included): every 10 ms that was 3 µs of
        # this process's CPU per fact, charged to the runtime; so rarely while far from the
        # end, every 5 ms near it (the time measured stays within 5 ms)
        while (seen := settled_facts()) < expected:  # noqa: ASYNC110
            await asyncio.sleep(0.005 if seen >= 0.9 * expected else 0.1)
        settled = time.perf_counter() - started
        while drain and await relayer.backlog():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        drained = time.perf_counter() - started
        stopping.set()
        await asyncio.gather(*tasks)
        return settled, drained
    finally:
        await pool.close()
        await nc.close()


def hello_fact(node_id: str, **fields: object) -> Hello:
    """A valid Hello of `node_id` at epoch 1 on gateway gw-0; `fields` override."""
    base: dict[str, object] = {
        "fact_id": uuid.uuid4(),
        "gateway_id": "gw-0",
        "observed_at": "2026-11-30T00:00:00Z",
        "node_id": node_id,
        "session_id": "s",
        "epoch": 1,
        "role": "worker",
        "boot_id": "boot-1",
        "journal_id": "journal-1",
        "daemon_version": "1.0.0",
        "proto_max": 3,
        "trust_version": 1,
        "capabilities": [],
        "running_command_ids": [],
        "inventory_hashes": {},
        "cert": {},
        "upgrade_required": False,
        "transport": "grpc",
        "previous": {"epoch": 0, "live": False},
    }
    return Hello.model_validate({**base, **fields}, strict=False)


def wire(subjects: Subjects, fact: Fact) -> tuple[str, bytes, dict[str, str]]:
    """(subject, body, headers) of a fact as a gateway publishes it."""
    body, headers = REGISTRY.encode(fact)
    headers["Nats-Msg-Id"] = str(fact.fact_id)
    return subjects.fact(fact.gateway_id, fact.BC_TYPE), body, headers


# -- worker processes (storm, herd) --------------------------------------------------------
def worker_env(target: BenchTarget) -> dict[str, str]:
    """The environment of a `bcw run` worker process against `target`."""
    return {
        "BCW_NATS_URL": target.nats_url,
        "BCW_DATABASE_URL": target.database_url,
        "BCW_SUBJECT_ROOT": target.subject_root,
        "BCW_HEALTH_PORT": "0",
        "BCW_LOG_LEVEL": "WARNING",
    }


async def join_herd(conn: asyncpg.Connection, nodes: int) -> None:
    """`nodes` joined nodes (`node-<i>`), each with one command in flight from before
    (dispatched at epoch 0), and a sweep history that starts now."""
    await conn.execute(
        "SELECT join_node('node-' || i, 'worker', 'node-serial-' || i, NULL) FROM generate_series(1, $1) i",
        nodes,
    )
    await conn.execute(
        "INSERT INTO commands (node_id, seq, kind, state, session_epoch, delivery_attempt) "
        "SELECT node_id, 1, 'exec', 'dispatched', 0, 1 FROM nodes; UPDATE nodes SET last_command_seq = 1"
    )
    await conn.execute(
        "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), grace_until = NULL"
    )


async def spawn_workers(
    target_env: dict[str, str],
    logs: Path | None = None,
    command: Sequence[str] = (sys.executable, "-m", "workers.cli"),
    tag: str = "",
    names: Iterable[str] | None = None,
) -> dict[str, asyncio.subprocess.Process]:
    """Each of the five workers (or of `names`: `relay`, say) in a `bcw run <worker>`
    process of its own (`command` is the `bcw` to run: another release's, say); with
    `logs`, what each one writes goes to `<logs>/<tag><worker>.log`."""
    from workers.registry import WORKERS

    procs = {}
    for name in WORKERS if names is None else names:
        out: int | TextIO = asyncio.subprocess.DEVNULL
        if logs is not None:
            out = (logs / f"{tag}{name}.log").open("w")
        procs[name] = await asyncio.create_subprocess_exec(
            *command,
            "run",
            name,
            env={**os.environ, **target_env},
            stdout=out,
            stderr=None if logs is None else asyncio.subprocess.STDOUT,
            preexec_fn=die_with_parent(signal.SIGTERM),  # a bench killed stops its workers
        )
        if logs is not None:
            out.close()  # type: ignore[union-attr]  # the child holds its own descriptor
    return procs


async def stop_workers(procs: dict[str, asyncio.subprocess.Process]) -> None:
    """SIGTERM to each worker process still running, and wait for them all."""
    for proc in procs.values():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    await asyncio.gather(*(p.wait() for p in procs.values()))


async def workers_bound(
    js: JetStreamContext, subjects: Subjects, names: Iterable[str] | None = None
) -> bool:
    """Every worker's durable consumer (or `names`') exists, so that no fact is published
    before it."""
    from workers.registry import WORKERS

    try:
        for name in WORKERS if names is None else names:
            await js.consumer_info(subjects.facts_stream, name)
    except Exception:
        return False
    return True


async def consumer_idle(js: JetStreamContext, stream: str, name: str) -> bool:
    info = await js.consumer_info(stream, name)
    return not info.num_pending and not info.num_ack_pending


async def wait_until(what: Callable[[], Awaitable[bool]], within: float = 900) -> float:
    """The monotonic time at which `what()` first held."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await what():
            return time.monotonic()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"not settled within {within:.0f} s")


async def spawn_relay(target: BenchTarget) -> asyncio.subprocess.Process:
    """A `bcw run relay` process for `target`, once it has started."""
    env = {**worker_env(target), "BCW_OUTBOX_BATCH_SIZE": "1000"}
    process = (await spawn_workers(env, names=["relay"]))["relay"]
    # connected and listening before the facts flow: once it has stopped spending CPU
    # (its start is not its work; on a busy machine it takes longer than a second)
    await asyncio.sleep(1.0)
    spent = cpu_seconds(process.pid)
    for _ in range(100):
        await asyncio.sleep(0.2)
        now = cpu_seconds(process.pid)
        if now - spent < 0.005:
            break
        spent = now
    return process

"""One worker process: connect, provision, consume, relay, serve health; stop cleanly.

Called by `bcw run` (and by tests, with their own tracer provider and stop event).
Root tasks run in one TaskGroup, so a failure stops the process loudly. Stopping means:
no more fetches, the batch in hand finishes, queued batches are released for
redelivery, the outbox is flushed, all within a bounded drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import asyncpg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from schemas.subjects import Subjects
from workers.runtime import bus, db, leases, retention, tracing
from workers.runtime.consumer import FactConsumer
from workers.runtime.deadletter import watch_max_deliveries
from workers.runtime.errors import is_transient
from workers.runtime.health import HealthServer
from workers.runtime.metrics import Metrics
from workers.runtime.outbox import OutboxRelay
from workers.runtime.settings import Settings
from workers.runtime.waiting import sleep_or_stop
from workers.runtime.worker import Runtime, Worker

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _until_up(what: str, attempt: Callable[[], Awaitable[T]], stopping: asyncio.Event) -> T:
    """Retry a transient start-up failure forever (servers may come up after us)."""
    delay = 0.2
    while True:
        try:
            return await attempt()
        except Exception as error:
            if not is_transient(error) or stopping.is_set():
                raise
            log.warning("%s not reachable yet (%s); retrying in %.1fs", what, error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def run_process(
    settings: Settings,
    workers: Sequence[Worker],
    *,
    stopping: asyncio.Event | None = None,
    provider: trace.TracerProvider | None = None,
    on_ready: Callable[[Runtime, int], None] | None = None,
) -> None:
    """Run `workers` in this process until `stopping` is set; then drain and return."""
    stopping = stopping or asyncio.Event()
    names = "+".join(w.name for w in workers) or "relay"
    instance = settings.instance or f"{socket.gethostname()}:{os.getpid()}"
    own_provider = provider is None
    provider = provider or tracing.build_provider(f"bcw-{names}")
    tracer = tracing.tracer(provider)
    metrics = Metrics()
    subjects = Subjects(settings.subject_root)

    nc = await _until_up(
        "NATS", lambda: bus.connect(settings.nats, name=f"bcw {names} {instance}"), stopping
    )
    pool = await _until_up("PostgreSQL", lambda: db.create_pool(settings.database), stopping)
    js = nc.jetstream()
    relay = OutboxRelay(pool, js, settings.outbox, settings.database, metrics, tracer)
    runtime = Runtime(settings, subjects, pool, nc, js, metrics, tracer, instance, relay.wake)
    consumers = [
        FactConsumer(
            worker,
            nc=nc,
            js=js,
            pool=pool,
            subjects=subjects,
            settings=settings.consumer,
            metrics=metrics,
            tracer=tracer,
            on_outbox_rows=relay.wake,
        )
        for worker in workers
    ]

    async def provision() -> None:
        await bus.provision_streams(js, subjects, settings.nats.stream_replicas)
        for consumer in consumers:
            spec = consumer.worker.consumer_spec(subjects)
            await bus.ensure_consumer(js, subjects.facts_stream, spec, settings.consumer)
            await consumer.bind()
            await watch_max_deliveries(nc, js, subjects, consumer.worker.name)

    async def ready() -> dict[str, bool]:
        return {
            "nats": nc.is_connected,
            "postgres": await _pool_usable(pool),
            "consumers": all(c.bound for c in consumers),
        }

    health = HealthServer(settings.health_port, ready, metrics.render)
    metrics.outbox_backlog.set(0)
    try:
        await _until_up("JetStream", provision, stopping)
        await health.start()
        log.info("running %s as %s (subject root %s)", names, instance, subjects.root)
        if on_ready is not None:
            on_ready(runtime, health.port)
        group = asyncio.create_task(_run_tasks(runtime, relay, consumers, workers, stopping))
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait({group, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if not group.done():
            try:
                await asyncio.wait_for(group, settings.consumer.drain_seconds)
            except TimeoutError:
                log.warning(
                    "drain took longer than %.0fs; stopped it", settings.consumer.drain_seconds
                )
        else:
            group.result()
        if settings.outbox.relay:
            with contextlib.suppress(Exception):
                flushed = await relay.flush(time.monotonic() + 1.5)
                log.info("stopped; flushed %d outbox row(s)", flushed)
    finally:
        await health.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.flush(), 1)  # acks are buffered in the client
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pool.close(), 2)
        if own_provider and isinstance(provider, TracerProvider):
            provider.shutdown()  # flushes spans not yet exported


async def _run_tasks(
    runtime: Runtime,
    relay: OutboxRelay,
    consumers: Sequence[FactConsumer],
    workers: Sequence[Worker],
    stopping: asyncio.Event,
) -> None:
    async with asyncio.TaskGroup() as group:
        if runtime.settings.outbox.relay:
            group.create_task(relay.run(stopping), name="outbox-relay")
        for consumer in consumers:
            group.create_task(consumer.run(stopping), name=f"{consumer.worker.name}-consume")
        for worker in workers:
            for loop in worker.loops:
                group.create_task(loop(runtime, stopping), name=f"{worker.name}-{loop.__name__}")
        group.create_task(_observe(runtime, relay, consumers, stopping), name="observe")
        if consumers:
            group.create_task(_prune_inbox(runtime, stopping), name="inbox-retention")


async def _prune_inbox(runtime: Runtime, stopping: asyncio.Event) -> None:
    """Inbox rows outlive the facts stream's max age, then go (one replica does it)."""
    settings = runtime.settings.retention
    target = retention.Prunable("processed_facts", "processed_at", settings.processed_facts)

    async def body(lease: leases.Lease) -> None:
        await retention.prune(runtime.pool, target, settings.batch, lease)

    await leases.run_leased(
        runtime.pool,
        "inbox-retention",
        runtime.instance,
        body,
        period=settings.interval,
        ttl=max(settings.lease_ttl, timedelta(seconds=2 * settings.interval)),
        stopping=stopping,
    )


async def _observe(
    runtime: Runtime, relay: OutboxRelay, consumers: Sequence[FactConsumer], stopping: asyncio.Event
) -> None:
    """Refresh the gauges that need a question to the servers, every few seconds."""
    while not stopping.is_set():
        with contextlib.suppress(Exception):
            runtime.metrics.outbox_backlog.set(float(await relay.backlog()))
            for consumer in consumers:
                await consumer.observe()
        await sleep_or_stop(stopping, 5.0)


async def _pool_usable(pool: asyncpg.Pool) -> bool:
    try:
        async with asyncio.timeout(1.0):
            async with pool.acquire() as conn:
                return bool(await conn.fetchval("SELECT true"))
    except Exception:
        return False

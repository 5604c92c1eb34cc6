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
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeVar

import asyncpg
from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from schemas.subjects import Subjects
from workers.runtime.base.errors import SettingError, Severity, classify
from workers.runtime.base.settings import RuntimeSettings
from workers.runtime.base.waiting import Patience, sleep_or_stop
from workers.runtime.bus import connection, frames, principals, server, streams
from workers.runtime.bus.deadletter import watch_max_deliveries
from workers.runtime.effects.consumer import FactConsumer
from workers.runtime.effects.outbox import OutboxRelay
from workers.runtime.effects.worker import Runtime, Worker
from workers.runtime.housekeeping import observe, prune_inbox
from workers.runtime.observability import sql, tracing
from workers.runtime.observability.health import HealthServer
from workers.runtime.observability.metrics import Metrics
from workers.runtime.store import db

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _until_up(
    what: str, attempt: Callable[[], Awaitable[T]], stopping: asyncio.Event
) -> T | None:
    """Try `attempt` until it succeeds, waiting out transient failures (servers may come
    up after us); None when `stopping` is set first, even in the middle of an attempt.
    Fatal failures (a bad setting, credentials refused) are raised at once."""
    patience = Patience(f"waiting for {what}", log, base=0.5, cap=5.0, every=30.0)
    while not stopping.is_set():
        task = asyncio.ensure_future(attempt())
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        error = task.exception()
        if error is None:
            patience.succeeded()
            return task.result()
        if classify(error) is Severity.FATAL:
            raise error
        await sleep_or_stop(stopping, patience.failed(error))
    return None


@dataclass
class _Parts:
    """What the process has connected so far (read by /readyz while it waits)."""

    nc: NATS | None = None
    pool: asyncpg.Pool | None = None
    consumers: list[FactConsumer] = field(default_factory=list)
    provisioned: bool = False
    fatal: list[SettingError] = field(default_factory=list)

    async def ready(self) -> dict[str, bool]:
        return {
            "nats": self.nc is not None and self.nc.is_connected,
            "postgres": self.pool is not None and await db.usable(self.pool),
            "consumers": self.provisioned and all(c.bound for c in self.consumers),
        }


async def run_process(
    settings: RuntimeSettings,
    workers: Sequence[Worker],
    *,
    stopping: asyncio.Event | None = None,
    provider: trace.TracerProvider | None = None,
    on_ready: Callable[[Runtime, int], None] | None = None,
) -> None:
    """Run `workers` in this process until `stopping` is set; then drain and return.

    The health server comes first, so a probe sees the process alive (`/healthz`) but not
    ready (`/readyz` 503) while it waits for NATS and PostgreSQL. A stop is honoured in
    every phase. Raises a `SettingError` when a setting cannot work or a server refuses
    our credentials or grants (the entry point prints it and exits 2 or 3).
    """
    stopping = stopping or asyncio.Event()
    names = "+".join(w.name for w in workers) or "relay"
    instance = settings.instance or f"{socket.gethostname()}:{os.getpid()}"
    metrics = Metrics()
    for worker in workers:
        for kind in worker.metrics:
            metrics.of(kind)
    subjects = Subjects(settings.subject_root)
    parts = _Parts()

    def refused(error: SettingError) -> None:
        parts.fatal.append(error)
        stopping.set()

    own_provider = provider is None
    provider = provider or tracing.build_provider(f"bcw-{names}")  # SettingError: bad OTEL_*

    def notes() -> list[str]:
        said = (note(metrics) for worker in workers for note in worker.notes)
        return [line for line in said if line is not None]

    health = HealthServer(settings.health_port, parts.ready, metrics.exposition, notes=notes)
    try:
        await health.start()
    except OSError as error:
        raise SettingError(
            "BCW_HEALTH_PORT", f"cannot listen on {settings.health_port} ({error})"
        ) from error
    try:
        await _serve(
            settings,
            workers,
            names,
            instance,
            metrics,
            subjects,
            parts,
            health,
            provider,
            stopping,
            refused,
            on_ready,
        )
    finally:
        await health.stop()
        if own_provider and isinstance(provider, TracerProvider):
            provider.shutdown()  # flushes spans not yet exported
    if parts.fatal:
        raise parts.fatal[0]


def dead_publishers(workers: Sequence[str]) -> tuple[str, ...]:
    """The dead-letter streams a process checks at start: its workers' own (a worker's relay
    dead-letters as its worker), or the relay's; a worker not of the fleet's (a test's, a
    benchmark's: its rows' letters say `relay`) adds the relay's. Pure."""
    foreign = not workers or any(w not in principals.EMITS for w in workers)
    return (*workers, *(["relay"] if foreign else []))


async def _serve(
    settings: RuntimeSettings,
    workers: Sequence[Worker],
    names: str,
    instance: str,
    metrics: Metrics,
    subjects: Subjects,
    parts: _Parts,
    health: HealthServer,
    provider: trace.TracerProvider,
    stopping: asyncio.Event,
    refused: Callable[[SettingError], None],
    on_ready: Callable[[Runtime, int], None] | None,
) -> None:
    tracer = tracing.tracer(provider)
    refused_subjects = connection.RefusedSubjects()  # the relay dead-letters rows bound there
    parts.nc = await _until_up(
        "NATS",
        lambda: connection.connect(
            settings.nats,
            name=f"bcw {names} {instance}",
            on_event=metrics.nats_events(f"bcw {names}"),  # disconnects, reconnects
            on_refused=refused,
            on_publish_refused=refused_subjects.add,
        ),
        stopping,
    )
    if parts.nc is None:
        return
    nc = parts.nc
    await frames.verify(nc, settings.nats.fast_path)  # or the public API, said once
    # each statement run inside a span becomes a CLIENT span of it (none without tracing)
    traced = tracing.is_recording(tracer)
    sql_spans = sql.SqlSpans(tracer, settings.trace_query_text).install if traced else None
    try:
        waited = metrics.db_pool_acquire_seconds.observe
        pooled = partial(db.create_pool, settings.database, init=sql_spans, on_acquire=waited)
        parts.pool = await _until_up("PostgreSQL", pooled, stopping)
        if parts.pool is None:
            return
        pool = parts.pool
        metrics.watch_pool(pool)
        js = nc.jetstream()
        relay = OutboxRelay(
            pool,
            js,
            settings.outbox,
            settings.database,
            metrics,
            tracer,
            subjects,
            refused=refused_subjects,
            # its own workers' rows (its principal may publish what they emit); a process
            # of no worker (`bcw run relay`) publishes every worker's
            owners=[worker.name for worker in workers] or None,
        )
        runtime = Runtime(settings, subjects, pool, nc, js, metrics, tracer, instance, relay.wake)
        parts.consumers = [
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
            # created when missing, never changed: only `bcw provision` updates a stream;
            # a dedicated relay checks only the streams it publishes to (its principal
            # may read no other's info: no facts stream, no gateway's own)
            limits = replace(
                streams.limits_of(settings.nats, server.server_version(nc)),
                dead_publishers=dead_publishers([w.name for w in workers]),
            )
            await streams.streams_for_a_worker(
                js,
                subjects,
                settings.nats.stream_replicas,
                limits,
                only=None if workers else principals.relay_streams(subjects),
            )

        def bound(consumer: FactConsumer) -> Callable[[], Awaitable[None]]:
            async def bind() -> None:
                # as `bcw provision` made it; made here only where the principal may (a
                # development server): a worker's nkey may not create its consumer
                spec = consumer.worker.consumer_spec(subjects)
                made = await streams.consumer_for_a_worker(
                    js, subjects.facts_stream, spec, settings.consumer
                )
                if made != "ok":
                    log.info("consumer %s %s", spec.durable, made)
                await consumer.bind()
                await watch_max_deliveries(nc, js, subjects, consumer.worker.name)

            return bind

        if await _until_up("JetStream", _provisioning(provision), stopping) is None:
            return
        for consumer in parts.consumers:  # missing or different: said, and waited for
            what = f"its consumer {consumer.worker.name}"
            if await _until_up(what, _provisioning(bound(consumer)), stopping) is None:
                return
        parts.provisioned = True
        metrics.outbox_backlog.set(0)
        log.info("running %s as %s (subject root %s)", names, instance, subjects.root)
        if on_ready is not None:
            on_ready(runtime, health.port)
        try:
            await _run_until_stopped(runtime, relay, parts.consumers, workers, stopping)
        except BaseExceptionGroup as failed:  # a root task's fatal error names its setting
            fatal = failed.subgroup(SettingError)
            if fatal is None:
                raise
            raise _first(fatal) from failed
    finally:
        await _close(nc, parts.pool)


def _first(group: BaseExceptionGroup[SettingError]) -> SettingError:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _provisioning(provision: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[bool]]:
    """A provisioning attempt; a stream the server cannot change in place is a bad setting."""

    async def attempt() -> bool:
        try:
            await provision()
        except streams.ProvisionError as error:
            raise SettingError("BCW_SUBJECT_ROOT", str(error)) from error
        return True

    return attempt


async def _run_until_stopped(
    runtime: Runtime,
    relay: OutboxRelay,
    consumers: Sequence[FactConsumer],
    workers: Sequence[Worker],
    stopping: asyncio.Event,
) -> None:
    """The root tasks until `stopping`; then a drain bounded so the process exits in time."""
    settings = runtime.settings
    group = asyncio.create_task(_run_tasks(runtime, relay, consumers, workers, stopping))
    stop_wait = asyncio.create_task(stopping.wait())
    await asyncio.wait({group, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if group.done():
        group.result()
        return
    drain = max(0.5, settings.consumer.drain_seconds - 3.0)  # the rest: cut-off, flush, close
    await asyncio.wait({group}, timeout=drain)
    if not group.done():
        # Something waits on a server that does not answer (a partition): asyncpg would
        # wait out its command timeout even to roll back a cancelled transaction. Cut
        # the connections first, so every such wait fails at once; then cancel.
        log.warning("drain took longer than %.0fs; cutting it short", drain)
        runtime.pool.terminate()
        group.cancel()
        await asyncio.wait({group}, timeout=2.0)  # consumers release what they hold
        return
    group.result()
    if settings.outbox.relay:
        try:
            flushed = await asyncio.wait_for(relay.flush(time.monotonic() + 1.0), 1.2)
            log.info("stopped; flushed %d outbox row(s)", flushed)
        except Exception as error:  # the rows stay; the next relay publishes them
            log.info("stopped; outbox left for the next relay (%s)", type(error).__name__)


async def _close(nc: NATS, pool: asyncpg.Pool | None) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.flush(), 0.5)  # acks are buffered in the client
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 1)
    if pool is not None:
        try:
            await asyncio.wait_for(pool.close(), 1)
        except Exception:  # a connection stuck on a dead server: do not wait for it
            pool.terminate()


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
        group.create_task(observe(runtime, relay, consumers, stopping), name="observe")
        if consumers:
            group.create_task(prune_inbox(runtime, workers, stopping), name="inbox-retention")

"""What a worker process does beside consuming: prune its workers' inbox and old session
history under a lease, refresh the gauges that ask the servers, hand free memory back.

Root tasks started by `process.py` (one of each per process); each runs until `stopping`
and swallows nothing silently. Applies no fact and settles no message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from datetime import timedelta

from workers.runtime.base import heap
from workers.runtime.base.waiting import sleep_or_stop
from workers.runtime.bus import streams
from workers.runtime.effects.consumer import FactConsumer
from workers.runtime.effects.outbox import OutboxRelay
from workers.runtime.effects.worker import Runtime, Worker
from workers.runtime.store import leases, retention


async def prune_inbox(runtime: Runtime, workers: Sequence[Worker], stopping: asyncio.Event) -> None:
    """Inbox rows outlive the facts stream's max age, then go; so does old session
    history. One replica of each worker does it, under a lease of that worker's: a
    worker's login reads and deletes only its own inbox rows (row-level security)."""
    settings = runtime.settings.retention
    targets = (
        retention.Prunable("processed_facts", "processed_at", settings.processed_facts),
        retention.Prunable("session_history", "at", settings.session_history),
        retention.Prunable("session_history_packs", "at", settings.session_history),
    )

    async def body(lease: leases.Lease) -> None:
        for target in targets:
            await retention.prune(runtime.pool, target, settings.batch, lease)

    await leases.run_leased(
        runtime.pool,
        leases.inbox_pruning([worker.name for worker in workers]),
        runtime.instance,
        body,
        period=settings.interval,
        ttl=max(settings.lease_ttl, timedelta(seconds=2 * settings.interval)),
        stopping=stopping,
        held=runtime.metrics.lease_held,
    )


async def observe(
    runtime: Runtime, relay: OutboxRelay, consumers: Sequence[FactConsumer], stopping: asyncio.Event
) -> None:
    """Refresh the gauges that need a question to the servers, every few seconds; hand
    the allocator's free memory back every minute (`heap.release`)."""
    limits = streams.limits_of(runtime.settings.nats)  # which facts streams there are
    released = time.monotonic()
    while not stopping.is_set():
        if time.monotonic() - released >= heap.RELEASE_SECONDS:
            heap.release()
            released = time.monotonic()
        with contextlib.suppress(Exception):
            await relay.observe()
            for consumer in consumers:
                await consumer.observe()
            if consumers:  # a full facts stream refuses every gateway's facts
                for (stream, bound), ratio in (
                    await streams.facts_fill(runtime.js, runtime.subjects, limits)
                ).items():
                    runtime.metrics.facts_stream_full.set(ratio, stream, bound)
        await sleep_or_stop(stopping, 5.0)

"""Fact recorder (`bcw run recorder`): node events and status reports.

Stores event batches once per `(node_id, journal_id, seq)`, raises the current
journal's `acked_event_seq` and answers the gateway with an `event-ack`; records status
reports so that nothing moves backwards; prunes old events under the
`recorder-retention` lease.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from workers.recorder.apply import handle
from workers.runtime.base.settings import RuntimeSettings
from workers.runtime.effects.worker import Runtime, Worker
from workers.runtime.store import leases, retention

LEASE = "recorder-retention"


def build(settings: RuntimeSettings) -> Worker:
    async def prune_events(runtime: Runtime, stopping: asyncio.Event) -> None:
        target = retention.Prunable("node_events", "recorded_at", settings.retention.node_events)

        async def body(lease: leases.Lease) -> None:
            await retention.prune(runtime.pool, target, settings.retention.batch, lease)

        await leases.run_leased(
            runtime.pool,
            LEASE,
            runtime.instance,
            body,
            period=settings.retention.interval,
            ttl=max(
                settings.retention.lease_ttl, timedelta(seconds=2 * settings.retention.interval)
            ),
            stopping=stopping,
            held=runtime.metrics.lease_held,
        )

    return Worker(
        name="recorder", fact_types=("events", "status"), handle=handle, loops=(prune_events,)
    )

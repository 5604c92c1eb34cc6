"""Drive one worker on the real servers: a worker process runs in-task; facts are
published to JetStream and the driver waits until each is settled; events and notices
are read back from their streams once the outbox is empty."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from schemas import REGISTRY, Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    OUTBOX_LEFT,
    count,
    eventually,
    make_settings,
    publish_fact,
    running,
    stream_messages,
)
from workers.runtime.effects.worker import Runtime, Worker
from workers.settings import Settings


@dataclass
class Driver:
    nc: NATS
    subjects: Subjects
    runtime: Runtime
    worker: str
    database_url: str

    def final(self) -> int:
        """Facts settled for good: a RETRY or a RELEASE hands the fact back for a later
        delivery, which settles it again."""
        return self.settled() - self.settled("retry") - self.settled("released")

    def settled(self, outcome: str | None = None) -> int:
        counter = self.runtime.metrics.facts
        return int(
            sum(
                value
                for (worker, _type, result), value in counter.by_labels().items()
                if worker == self.worker and (outcome is None or result == outcome)
            )
        )

    async def send(self, *facts: Fact, again: bool = False) -> None:
        """Publish `facts` in order and wait until the worker settled every one for good
        (`final`: a retry is not the end of a fact).

        `again`: publish under a new Nats-Msg-Id, as a re-publish after the duplicate
        window would (JetStream stores it; only the inbox can catch it).
        """
        before = self.final()
        js = self.nc.jetstream()
        for fact in facts:
            await publish_fact(js, self.subjects, fact, msg_id=str(uuid.uuid4()) if again else None)
        await eventually(
            lambda: _finally_settled(self, before + len(facts)), what=f"{len(facts)} facts settled"
        )

    async def published(
        self, bc_type: str | None = None, stream: str = "events"
    ) -> list[dict[str, Any]]:
        """Bodies published so far (after the outbox drained), oldest first."""
        await eventually(lambda: _outbox_empty(self.database_url), what="outbox drained")
        name = {
            "events": self.subjects.events_stream,
            "notices": self.subjects.gateway_stream,
        }[stream]
        out = []
        for msg in await stream_messages(self.nc.jetstream(), name):
            if bc_type is None or msg.headers.get("Bc-Type") == bc_type:
                body = json.loads(msg.data)
                REGISTRY.decode(msg.headers, msg.data)  # what was published is valid
                body["_subject"] = msg.subject
                out.append(body)
        return out


async def _finally_settled(driver: Driver, n: int) -> bool:
    return driver.final() >= n


async def _outbox_empty(database_url: str) -> bool:
    return await count(database_url, OUTBOX_LEFT) == 0


@contextlib.asynccontextmanager
async def driving(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    build: Callable[[Settings], Worker],
    **consumer: Any,
) -> AsyncIterator[Driver]:
    settings = make_settings(servers.nats_url, database_url, subjects, **consumer)
    worker = build(settings)
    async with running(settings, [worker]) as (runtime, _port):
        yield Driver(nc, subjects, runtime, worker.name, database_url)


async def fetch(database_url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()

"""A flow of Hellos for fault tests, and the exact end state the five workers owe it.

Every node is admitted once, as a gateway's Hello transaction does (joined, its session
at epoch 1 on `gw-1`), before the flow starts; its Hello fact is then published at a
steady rate, re-published with the same `Nats-Msg-Id` through any outage (as gateways
do). Real SQL, real JetStream: this is the gateway's side, not a mock of anything.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import asyncpg
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.support import (
    OUTBOX_LEFT,
    count,
    publish_through_outages,
    stream_messages,
)
from workers.runtime.bus import deadletter

GATEWAY = "gw-1"
#: the workers a Hello has effects in that keep an inbox row per fact; the third, the
#: labeler, keeps none (its effects are idempotent by construction): its labels say it
#: is done
WITH_INBOX = ("liveness", "replay")


def capabilities(i: int) -> list[str]:
    return sorted({"gpu", f"rack-{i % 7}"})


@dataclass
class HelloFlow:
    size: int
    prefix: str = "node"

    @property
    def nodes(self) -> list[str]:
        return [f"{self.prefix}-{i:05d}" for i in range(self.size)]

    async def admit(self, database_url: str) -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await fleet.gateway(conn, GATEWAY, expires_in=timedelta(hours=1))
            for node in self.nodes:
                await fleet.session(conn, node, epoch=1, gateway_id=GATEWAY)
        finally:
            await conn.close()

    async def publish(
        self, nc: NATS, subjects: Subjects, per_second: float, part: slice = slice(None)
    ) -> None:
        """Publish every node's Hello (those of `part`); through an outage, retry each
        until JetStream has it."""
        js = nc.jetstream()
        for i, node in list(enumerate(self.nodes))[part]:
            fact = fleet.hello(node, 1, gateway_id=GATEWAY, capabilities=capabilities(i))
            await publish_through_outages(js, subjects, fact)
            await asyncio.sleep(1 / per_second)

    @property
    def labels(self) -> int:
        """The system labels the labeler owes the flow."""
        return sum(len(capabilities(i)) for i in range(self.size))

    async def done(self, database_url: str) -> bool:
        """Every Hello handled by every worker with effects, and the outbox empty."""
        handled = await count(
            database_url,
            "SELECT count(*) FROM processed_facts WHERE consumer = ANY($1::text[])",
            list(WITH_INBOX),
        )
        labels = await count(
            database_url, "SELECT count(*) FROM node_labels WHERE source = 'system'"
        )
        outbox = await count(database_url, OUTBOX_LEFT)
        return handled == self.size * len(WITH_INBOX) and labels == self.labels and outbox == 0

    async def assert_exact(self, database_url: str, nc: NATS, subjects: Subjects) -> None:
        """Every effect once: inbox rows, capabilities, labels, events; nothing dead."""
        conn = await asyncpg.connect(database_url)
        try:
            per_consumer = dict(
                await conn.fetch("SELECT consumer, count(*) FROM processed_facts GROUP BY consumer")
            )
            stored = {
                r["node_id"]: r["capabilities"]
                for r in await conn.fetch("SELECT node_id, capabilities FROM node_sessions")
            }
            labels = await conn.fetchval("SELECT count(*) FROM node_labels WHERE source = 'system'")
        finally:
            await conn.close()
        for worker in WITH_INBOX:
            assert per_consumer.get(worker) == self.size, (worker, per_consumer)
        assert "labeler" not in per_consumer, per_consumer  # it keeps no inbox
        for i, node in enumerate(self.nodes):
            assert stored[node] == capabilities(i), node
        assert labels == self.labels

        events = await stream_messages(nc.jetstream(), subjects.events_stream)
        by_type: dict[str, Counter[str]] = {}
        for msg in events:  # node events; gateway.* events (nobody flushes here) name no node
            body = json.loads(msg.data)
            if "nodeId" in body:
                by_type.setdefault(msg.headers["Bc-Type"], Counter())[body["nodeId"]] += 1
        for bc_type in ("node.connected", "node.capabilities-changed"):
            seen = by_type.get(bc_type, Counter())
            assert set(seen) == set(self.nodes), f"{bc_type}: missing or foreign nodes"
            doubled = {node: n for node, n in seen.items() if n != 1}
            assert not doubled, f"{bc_type} more than once: {doubled}"
        assert await dead_letters(nc, subjects) == []


async def dead_letters(nc: NATS, subjects: Subjects) -> list[str]:
    """What is in the dead-letter streams (a reason per message); [] when none exists."""
    js, out = nc.jetstream(), []
    for stream in await deadletter.dead_streams(js, subjects):
        try:
            messages = await stream_messages(js, stream)
        except Exception as error:  # the stream was never created: nothing was dead-lettered
            if "not found" in str(error).lower():
                continue
            raise
        out += [f"{m.subject}: {m.headers.get('Bc-Dead-Reason')}" for m in messages]
    return out

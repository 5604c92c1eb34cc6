"""A flood from one gateway (issue "trust boundaries"): gw-flood publishes a flush naming
10,000 nodes that do not exist every second for 30 s — well-formed facts on its own
subject, as a buggy or hostile gateway could. Storage stays bounded (no row or notice
per entry: at most `BCW_LIVENESS_MAX_ZOMBIE_NOTICES` zombie notices per batch of its
flushes), and another gateway's Hellos are applied on time all along.

What is real: nats-server, PostgreSQL, the liveness controller and the labeler. The
length of the flood is the point of this test, so it takes 30 s."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas import REGISTRY
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.support import eventually, make_settings, publish_fact, running
from workers import labeler, liveness
from workers.runtime.bus import streams
from workers.tools.explain import HISTORY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SECONDS = 30
ENTRIES = 10_000
HELLO_EVERY = 3.0
#: a healthy gateway's Hello is labeled within this, flood or not: under a second on a quiet
#: machine; 20 s leaves room for the suite's 8 processes on 2 cores (one Hello took 14.9 s
#: there once), while a flood that held the labeler up would keep it for the flood's 30 s
ON_TIME = 20.0


async def _flood(nc: NATS, subjects: Subjects) -> int:
    """One flush a second, each naming 10,000 nodes nobody joined; how many it sent."""
    js = nc.jetstream()
    entries = [{"node_id": f"ghost-{i:05d}", "epoch": 1, "age_ms": 0} for i in range(ENTRIES)]
    body = json.loads(REGISTRY.encode(make_fact("liveness", gateway_id="gw-flood"))[0])
    started, sent = time.monotonic(), 0
    while time.monotonic() - started < SECONDS:
        fact = {**body, "fact_id": str(uuid.uuid4()), "entries": entries}
        await js.publish(
            subjects.fact("gw-flood", "liveness"),
            json.dumps(fact).encode(),
            headers={"Bc-Type": "liveness", "Bc-Schema": "1", "Nats-Msg-Id": fact["fact_id"]},
        )
        sent += 1
        await asyncio.sleep(max(0.0, started + sent - time.monotonic()))
    return sent


async def test_a_flood_of_unknown_nodes_stays_bounded_and_others_stay_on_time(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    nodes = [f"n{i}" for i in range(int(SECONDS / HELLO_EVERY))]
    for node in nodes:
        await fleet.session(db, node, epoch=1, gateway_id="gw-1")
    settings = make_settings(servers.nats_url, database_url, subjects)
    workers = [liveness.build(settings), labeler.build(settings)]
    lateness: list[float] = []
    async with running(settings, workers):
        flooding = asyncio.create_task(_flood(nc, subjects))
        for node in nodes:  # gw-1's Hellos, all through the flood
            sent = time.monotonic()
            await publish_fact(nc.jetstream(), subjects, fleet.hello(node, 1, capabilities=["gpu"]))

            async def labeled(node: str = node) -> bool:
                return bool(
                    await db.fetchval("SELECT count(*) FROM node_labels WHERE node_id = $1", node)
                )

            await eventually(labeled, within=60, what=f"{node} labeled during the flood")
            lateness.append(time.monotonic() - sent)
            await asyncio.sleep(max(0.0, HELLO_EVERY - (time.monotonic() - sent)))
        flushes = await flooding

        async def drained() -> bool:
            info = await nc.jetstream().consumer_info(subjects.facts_stream, "liveness")
            return not info.num_pending and not info.num_ack_pending

        await eventually(drained, within=120, what="the flood applied")
    notices = (await nc.jetstream().stream_info(subjects.gateway_stream)).state.messages
    cap = settings.liveness.max_zombie_notices
    history = await db.fetchval(f"SELECT count(*) FROM {HISTORY} WHERE node_id LIKE 'ghost-%'")
    inbox = await db.fetchval("SELECT count(*) FROM processed_facts WHERE consumer = 'liveness'")
    print(
        f"{flushes} flushes of {ENTRIES} unknown nodes: {notices} zombie notices, "
        f"{history} history rows; Hellos labeled after {max(lateness):.1f} s at worst"
    )
    assert notices <= flushes * cap  # never a notice per entry (300,000 entries)
    assert history <= flushes * cap
    assert inbox <= flushes + len(nodes)  # one inbox row per fact, none per entry
    assert max(lateness) < ON_TIME, lateness

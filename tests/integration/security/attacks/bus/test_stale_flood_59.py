"""Issue 59, finding 9: a flood of stale facts blinds every gateway. gw-1's nkey replays
`closed` facts for epochs it was once issued (its nodes have since moved to gw-2): each is
bound to gw-1 (`provenance` passes it), so it was not shed as a foreign one, and each cost
a check and a fenced write — 231,445 in 20 s put every other gateway's flushes 12.9 s
behind, and blind.

Now a gateway's stale facts are counted per type like its foreign ones (past
`stale_threshold` in a window its `closed` facts are shed: acknowledged unread), so the
flood costs gw-1, not the others: gw-2's flush queued behind it is applied, and gw-1's
own flush of the session it still holds too. In both layouts (the workers read
`BC_FACTS` in one order either way). The figure (seconds from the worker's start to
gw-2's flush applied, facts shed) is printed; docs/benchmarks.md has it before and after.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from schemas import REGISTRY
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.security.conftest import (
    SUBJECTS,
    client_as,
    fresh_streams,
    nats_as,
    provision_consumers,
)
from tests.integration.support import eventually, make_settings, running
from workers.registry import WORKERS

pytestmark = pytest.mark.slow

FLOOD = 20_000
NODES = 200
LAYOUTS = {"A-one-stream": {}, "B-per-gateway": {"facts_gateways": "gw-1,gw-2"}}


async def _stored(keys: Path, secured: str, count: int) -> bool:
    async with client_as(keys, secured, "admin") as (nc, _):
        info = await nc.jetstream().stream_info(SUBJECTS.facts_stream)
        return (info.state.messages or 0) >= count


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
async def test_a_flood_of_a_gateways_stale_closes_costs_it_and_not_the_others(
    layout: dict[str, object], keys: Path, secured: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with fresh_streams(keys, secured, layout):
        pass
    # gw-1 was issued epoch 1 of each node; each moved to gw-2 at epoch 2
    for i in range(NODES):
        await fleet.session(db, f"n{i}", epoch=1, gateway_id="gw-1")
        await fleet.session(db, f"n{i}", epoch=2, gateway_id="gw-2", seen_ago=timedelta(minutes=5))
    await fleet.session(db, "mine", epoch=1, gateway_id="gw-1", seen_ago=timedelta(minutes=5))
    template = make_fact("closed", gateway_id="gw-1", node_id="n0", epoch=1)
    body, headers = REGISTRY.encode(template)
    wire = json.loads(body)
    async with client_as(keys, secured, "gateway-gw-1") as (attacker, errors):
        for i in range(FLOOD):
            wire["fact_id"], wire["node_id"] = str(uuid.uuid4()), f"n{i % NODES}"
            await attacker.publish(
                SUBJECTS.fact("gw-1", "closed"),
                json.dumps(wire).encode(),
                headers={**headers, "Nats-Msg-Id": wire["fact_id"]},
            )
        mine = make_fact(
            "liveness", gateway_id="gw-1", entries=[{"node_id": "mine", "epoch": 1, "age_ms": 0}]
        )
        body, mine_headers = REGISTRY.encode(mine)
        await attacker.jetstream().publish(
            SUBJECTS.fact("gw-1", "liveness"),
            body,
            headers={**mine_headers, "Nats-Msg-Id": str(mine.fact_id)},
        )
        assert not errors
    async with client_as(keys, secured, "gateway-gw-2") as (honest, _):
        flush = make_fact(
            "liveness",
            gateway_id="gw-2",
            entries=[{"node_id": f"n{i}", "epoch": 2, "age_ms": 0} for i in range(NODES)],
        )
        body, flush_headers = REGISTRY.encode(flush)
        await honest.jetstream().publish(
            SUBJECTS.fact("gw-2", "liveness"),
            body,
            headers={**flush_headers, "Nats-Msg-Id": str(flush.fact_id)},
        )
    await eventually(lambda: _stored(keys, secured, FLOOD + 2), within=60, what="the flood stored")
    settings = make_settings(secured, database_url, SUBJECTS)
    worker = settings.model_copy(
        update={"nats": nats_as(keys, secured, "worker-liveness").model_copy(update=layout)}
    )
    await provision_consumers(keys, secured, worker, ["liveness"])
    started = time.monotonic()
    async with running(worker, [WORKERS["liveness"](worker)]) as (runtime, _port):

        async def seen(node: str) -> bool:
            return bool(
                await db.fetchval(
                    "SELECT last_seen > compute_now() - interval '1 minute' FROM node_sessions "
                    "WHERE node_id = $1",
                    node,
                )
            )

        await eventually(lambda: seen("n0"), within=120, what="gw-2's flush applied")
        late = time.monotonic() - started
        await eventually(lambda: seen("mine"), within=30, what="gw-1's own flush applied")
        shed = runtime.metrics.facts.value("liveness", "closed", "shed")
        stale = runtime.metrics.facts.value("liveness", "closed", "stale")
    print(
        f"{FLOOD:,} stale closes from gw-1: gw-2's flush applied {late:.1f} s after the "
        f"worker's start; {shed:,.0f} shed, {stale:,.0f} checked (stale)"
    )
    assert shed >= FLOOD // 2, (shed, stale)
    # nothing changed: every node still routed to gw-2 at epoch 2, none disconnected
    rows = await db.fetch(
        "SELECT DISTINCT gateway_id, session_epoch, disconnected_at IS NULL AS up "
        "FROM node_sessions WHERE node_id LIKE 'n%'"
    )
    assert [tuple(r) for r in rows] == [("gw-2", 2, True)]

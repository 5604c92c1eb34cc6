"""Issue 59, finding 4: a gateway's nkey fills the facts stream by message count (60,000
empty messages in 0.3 s filled `BC_FACTS`, whose `max_msgs` was the total's, and the fill
gauge read 0.0: it measured bytes). Now, as gw-1's own nkey:

- **B** (a facts stream per gateway): gw-1's stream holds at most its
  `facts_msgs_per_gateway` messages, its new ones refused beyond; `BC_FACTS` sources
  every gateway's with no count bound of its own; the gauge reads gw-1's stream full by
  messages while its bytes are nearly nothing;
- **A** (one facts stream): each of gw-1's subjects (one per fact type) holds at most an
  eighth of `facts_msgs_per_gateway`, its new ones refused beyond: gw-1 holds at most
  that many of the stream, whatever it sends.

Either way gw-2's flush is accepted and applied by the liveness worker, logged in as its
own principal (gw-2 is not blind)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import nats.js.errors
import pytest

from schemas import REGISTRY
from schemas.facts import FACT_TYPES
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

PER_GATEWAY = 1000
LAYOUTS = {
    "A-one-stream": {"facts_msgs_per_gateway": PER_GATEWAY, "stream_max_msgs": 10 * PER_GATEWAY},
    "B-per-gateway": {
        "facts_gateways": "gw-1,gw-2",
        "facts_msgs_per_gateway": PER_GATEWAY,
        "stream_max_msgs": 10 * PER_GATEWAY,
    },
}


async def _flood(keys: Path, secured: str) -> tuple[int, int, float, set[str]]:
    """gw-1 publishes empty messages, PER_GATEWAY + 200 to each of its subjects: (stored,
    refused, seconds, what the refusals said)."""
    stored = refused = 0
    said: set[str] = set()
    started = time.monotonic()
    async with client_as(keys, secured, "gateway-gw-1") as (attacker, _):
        js = attacker.jetstream()
        for fact_type in FACT_TYPES:
            subject = SUBJECTS.fact("gw-1", fact_type.BC_TYPE)
            for i in range(PER_GATEWAY // len(FACT_TYPES) + 200):
                try:
                    await js.publish(subject, b"", headers={"Nats-Msg-Id": f"{subject}-{i}"})
                    stored += 1
                except nats.js.errors.APIError as error:
                    refused += 1
                    said.add(str(error.description))
    return stored, refused, time.monotonic() - started, said


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
async def test_a_gateway_that_floods_empty_messages_fills_only_its_own_share_by_count(
    layout: dict[str, object], keys: Path, secured: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with fresh_streams(keys, secured, layout):
        pass  # the streams only
    await fleet.session(db, "theirs", epoch=3, gateway_id="gw-2", seen_ago=timedelta(minutes=5))
    stored, refused, seconds, said = await _flood(keys, secured)
    print(f"gw-1: {stored} stored, {refused} refused in {seconds:.2f} s: {sorted(said)}")
    assert stored == PER_GATEWAY and stored + refused == (PER_GATEWAY // 8 + 200) * len(FACT_TYPES)
    per_gateway = "facts_gateways" in layout
    assert said == {
        "maximum messages exceeded" if per_gateway else "maximum messages per subject exceeded"
    }
    async with client_as(keys, secured, "gateway-gw-2") as (honest, _):
        flush = make_fact(
            "liveness", gateway_id="gw-2", entries=[{"node_id": "theirs", "epoch": 3, "age_ms": 0}]
        )
        body, headers = REGISTRY.encode(flush)
        await honest.jetstream().publish(
            SUBJECTS.fact("gw-2", "liveness"),
            body,
            headers={**headers, "Nats-Msg-Id": str(flush.fact_id)},
        )
    settings = make_settings(secured, database_url, SUBJECTS)
    worker = settings.model_copy(
        update={"nats": nats_as(keys, secured, "worker-liveness").model_copy(update=layout)}
    )
    await provision_consumers(keys, secured, worker, ["liveness"])
    async with running(worker, [WORKERS["liveness"](worker)]) as (runtime, _port):

        async def seen() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT last_seen > compute_now() - interval '1 minute' FROM node_sessions "
                    "WHERE node_id = 'theirs'"
                )
            )

        await eventually(seen, within=60, what="gw-2's flush applied behind gw-1's flood")
        full = runtime.metrics.facts_stream_full
        facts = SUBJECTS.facts_stream
        if per_gateway:  # gw-1's own stream full by count, its bytes nearly nothing
            own = SUBJECTS.gateway_facts_stream("gw-1")

            async def said_full() -> bool:
                return full.value(own, "messages") >= 1.0

            await eventually(said_full, within=20, what="gw-1's stream said full by count")
            assert full.value(own, "bytes") < 0.01
            assert full.value(SUBJECTS.gateway_facts_stream("gw-2"), "messages") < 0.01
            assert full.value(facts, "messages") == 0.0  # the sourcing stream: no count bound
        else:

            async def said() -> bool:
                return full.value(facts, "messages") > 0.0

            await eventually(said, within=20, what="the facts stream's fill said")
            assert full.value(facts, "messages") <= (PER_GATEWAY + 1) / (10 * PER_GATEWAY)

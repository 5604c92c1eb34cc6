"""Poison facts on the real servers: values PostgreSQL would refuse are refused at
validation, dead-lettered `invalid` before any transaction — once by each worker that
reads them, in its own dead stream — and no batch is split to find them (`bcw_batch_splits_total` stays 0); the healthy facts of the same batch take effect,
and a genuine failed result with a 4,096-character error is stored, not dead-lettered."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from schemas import REGISTRY, Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.support import eventually, make_settings, publish_raw, running
from workers import labeler, liveness, replay
from workers.runtime.bus import deadletter, streams


def _wire(fact: Fact, **poison: Any) -> tuple[str, bytes, dict[str, str]]:
    body, headers = REGISTRY.encode(fact)
    return fact.BC_TYPE, json.dumps({**json.loads(body), **poison}).encode(), headers


async def test_poison_is_refused_at_validation_and_splits_no_batch(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1, seen_ago=timedelta(seconds=60))
    command = await db.fetchval(
        "INSERT INTO commands (node_id, seq, kind, state, session_epoch, delivery_attempt) "
        "VALUES ('n1', 1, 'exec', 'dispatched', 1, 1) RETURNING command_id"
    )
    await db.execute("UPDATE nodes SET last_command_seq = 1 WHERE node_id = 'n1'")

    def result(**fields: Any) -> Fact:
        return make_fact("result", node_id="n1", epoch=1, command_id=str(command), **fields)

    flush = make_fact("liveness", entries=[{"node_id": "n1", "epoch": 1, "age_ms": 0}])
    published = [
        _wire(fleet.hello("n1", 1, capabilities=["nvml"]), boot_id="a\u0000b"),  # poison
        _wire(fleet.hello("n1", 1, capabilities=["nvml"])),
        _wire(result(outcome="done"), result={"out": "x\u0000"}),  # poison
        _wire(result(outcome="done"), result={"ratio": float("nan")}),  # poison: not finite
        _wire(flush, entries=[{"node_id": "n1", "epoch": 1, "age_ms": 10**15}]),  # poison
        _wire(flush, observed_at="2026-11-30T00:00:00"),  # poison: no time zone
        _wire(flush),
        _wire(result(outcome="failed", error="e" * 4096)),  # genuine
    ]
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    for bc_type, body, headers in published:  # all there before the workers fetch: one batch
        await publish_raw(js, subjects.fact("gw-1", bc_type), body, headers)
    settings = make_settings(servers.nats_url, database_url, subjects, batch_size=64)
    workers = [labeler.build(settings), liveness.build(settings), replay.build(settings)]
    async with running(settings, workers) as (runtime, _port):

        async def settled() -> bool:
            seen = runtime.metrics.facts.by_labels()
            return sum(n for (_w, _t, _o), n in seen.items()) >= 3 + 4 + 5

        await eventually(settled, what="every fact settled by the workers it concerns")
        splits = {w.name: runtime.metrics.batch_splits.value(w.name) for w in workers}
    assert splits == {"labeler": 0, "liveness": 0, "replay": 0}
    letters = await deadletter.list_dead_letters(js, subjects)
    assert {letter.cause for letter in letters} == {"invalid"}
    # each poison fact once per worker that reads it, in that worker's own stream
    assert sorted((letter.worker, letter.reason.split(":")[0]) for letter in letters) == [
        ("labeler", "invalid hello"),
        ("liveness", "invalid hello"),
        ("liveness", "invalid liveness"),
        ("liveness", "invalid liveness"),
        ("replay", "invalid hello"),
        ("replay", "invalid result"),
        ("replay", "invalid result"),
    ]
    assert all(letter.stream == subjects.dead_stream_of(letter.worker) for letter in letters)
    row = await db.fetchrow(
        "SELECT c.state, c.failure_reason, s.last_seen > compute_now() - interval '10 seconds' AS seen,"
        " (SELECT array_agg(key) FROM node_labels l WHERE l.node_id = 'n1') AS labels"
        " FROM commands c JOIN node_sessions s USING (node_id)"
    )
    assert (row["state"], row["failure_reason"], row["seen"], row["labels"]) == (
        "failed",
        "e" * 4096,
        True,
        ["bc.dev/cap.nvml"],
    )

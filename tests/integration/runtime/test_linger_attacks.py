"""The consumer's linger (`BCW_CONSUMER_LINGER`) attacked on real servers: a stop while a
batch lingers, one node's facts across two lanes, the byte bound with flush-sized facts,
and a constant trickle (latency stays about the linger, never more)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    build_tally,
    count,
    eventually,
    make_settings,
    publish_fact,
    running,
    spawn_tally,
    status_fact,
    tally_effects,
    tally_pulling,
)
from workers.runtime.bus import streams
from workers.runtime.bus.pull import ContinuousPull

# -- the worker: a stop while a batch lingers, and one node's order over two lanes --------


async def _in_order(database_url: str) -> list[str]:
    """Each fact applied after a later one of its node (generations rise per node in the
    order they were published)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT node_id, generation FROM tally ORDER BY applied")
    finally:
        await conn.close()
    last: dict[str, int] = {}
    wrong = []
    for r in rows:
        if r["generation"] <= last.get(r["node_id"], 0):
            wrong.append(f"{r['node_id']}: {r['generation']} after {last[r['node_id']]}")
        last[r["node_id"]] = r["generation"]
    return wrong


async def _trickle(js: JetStreamContext, subjects: Subjects, total: int, every: float) -> None:
    """`total` facts over 5 nodes, one every `every` seconds; each node's generations rise."""
    for i in range(total):
        node = f"node-{i % 5}"
        await publish_fact(js, subjects, status_fact(node_id=node, observed_generation=i + 1))
        await asyncio.sleep(every)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("linger", ["0", "1"])
async def test_sigterm_while_a_batch_lingers_loses_nothing_and_applies_nothing_twice(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str, linger: str
) -> None:
    """The longest linger (1 s) and batches that never fill (a trickle of 25 facts a second,
    batch 256): almost always a batch lingers when SIGTERM comes. The process exits 0 in
    time; a restart finds every fact applied once, each node's in stream order."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    env = {"BCW_CONSUMER_LINGER": linger, "BCW_CONSUMER_LANES": "2", "BCW_CONSUMER_ACK_WAIT": "30"}
    total = 150
    trickle = asyncio.create_task(_trickle(js, subjects, total, 0.04))
    stops = []
    for _ in range(2):  # two stops, each in the middle of the trickle
        process = await spawn_tally(servers.nats_url, tally_db, subjects, **env)
        await eventually(lambda: tally_pulling(js, subjects), within=30, what="pulling")
        await asyncio.sleep(1.3)  # a batch or two applied, the next lingering
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        stops.append((await asyncio.wait_for(process.wait(), 15), time.monotonic() - started))
    last = await spawn_tally(servers.nats_url, tally_db, subjects, **env)
    try:
        await trickle
        await eventually(lambda: _count_is(tally_db, total), within=60, what="every fact applied")
        await asyncio.sleep(2.0)  # anything redelivered twice would show now
    finally:
        last.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(last.wait(), 15) == 0
    assert [code for code, _ in stops] == [0, 0]
    assert all(took < 8.0 for _, took in stops), stops  # within the drain bound
    assert await tally_effects(tally_db) == {1: total}
    assert await _in_order(tally_db) == []


async def _count_is(database_url: str, n: int) -> bool:
    return await count(database_url, "SELECT count(*) FROM tally") >= n


@pytest.mark.timeout(90)
async def test_one_nodes_facts_keep_stream_order_across_two_lanes_under_a_linger(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """Bursts and trickles of 20 nodes' facts into two lanes, batch 16, linger 0.2 s: full
    batches and lingering ones, merged queues; per node, applied in stream order."""
    settings = make_settings(
        servers.nats_url, tally_db, subjects, linger=0.2, lanes=2, batch_size=16
    )
    js = nc.jetstream()
    generation: dict[str, int] = {}
    sent = 0

    async def send(n: int, every: float) -> None:
        nonlocal sent
        for _ in range(n):
            node = f"node-{sent % 20}"
            generation[node] = generation.get(node, 0) + 1
            await publish_fact(
                js, subjects, status_fact(node_id=node, observed_generation=generation[node])
            )
            sent += 1
            if every:
                await asyncio.sleep(every)

    async with running(settings, [build_tally()]):
        for _ in range(3):
            await send(200, 0.0)  # a burst: full batches
            await send(30, 0.03)  # a trickle: lingering batches
        await eventually(lambda: _count_is(tally_db, sent), within=60, what="every fact")
    assert await tally_effects(tally_db) == {1: sent}
    assert await _in_order(tally_db) == []


# -- the pull: the byte bound with flush-sized facts, and a trickle -------------------------


@pytest.fixture
async def stream(nc: NATS) -> AsyncIterator[str]:
    name = f"LATK_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
    await js.add_consumer(
        name,
        ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=4096),
    )
    yield name
    await js.delete_stream(name)


def _flush_body(i: int, entries: int = 10_000) -> bytes:
    """A liveness flush of `entries` sessions, as big as the contract lets one be."""
    return json.dumps(
        {
            "seq": i,
            "entries": [
                {"node_id": f"node-{n:06d}", "epoch": 7, "age_ms": n % 15_000}
                for n in range(entries)
            ],
        }
    ).encode()


@pytest.mark.parametrize("linger", [0.0, 0.5])
@pytest.mark.timeout(90)
async def test_the_byte_bound_holds_with_10000_entry_flushes_under_a_linger(
    nc: NATS, stream: str, linger: float
) -> None:
    """24 flushes of 10,000 entries (~0.5 MB each) waiting; `max_bytes` 1 MiB. Nothing
    `done`: batches stop once twice the bound is in hand; each batch holds at most the
    bound; what is buffered stays within the requests' bytes; a byte-full batch never waits
    the linger out; then all come out once, in order."""
    max_bytes = 2**20
    js = nc.jetstream()
    bodies = [_flush_body(i) for i in range(24)]
    assert 400_000 < len(bodies[0]) < nc.max_payload
    for body in bodies:
        await js.publish(f"{stream.lower()}.liveness", body)
    pull = ContinuousPull(nc, stream, "c", batch=64, window=128, max_bytes=max_bytes, linger=linger)
    await pull.start()
    per_request = max(max_bytes, nc.max_payload + 65536)
    handed: list[list[Msg]] = []
    peak_held = peak_buffered = 0
    slow: list[float] = []
    try:
        while True:
            started = time.monotonic()
            batch = await pull.next_batch(2.0)
            took = time.monotonic() - started
            buffered = sum(len(m.data) for m in pull._buffer)
            peak_buffered = max(peak_buffered, buffered)
            if not batch:
                break
            if sum(len(m.data) for m in batch) + buffered >= max_bytes and took >= linger > 0:
                slow.append(took)  # it was full in bytes, and still lingered
            handed.append(batch)
            held = sum(len(m.data) for b in handed for m in b)
            peak_held = max(peak_held, held + buffered)
        stalled_at = sum(len(m.data) for b in handed for m in b)
        assert stalled_at >= 2 * max_bytes  # stopped for want of room, not of facts
        assert stalled_at < 3 * max_bytes
        assert all(len(b) == 1 or sum(len(m.data) for m in b) <= max_bytes for b in handed)
        assert peak_buffered <= 2 * per_request, peak_buffered
        assert peak_held <= 3 * max_bytes + 2 * per_request, peak_held
        assert slow == [], slow
        for batch in handed:  # settled: room again, the rest comes
            pull.done(batch)
        while True:
            batch = await pull.next_batch(2.0)
            if not batch:
                break
            handed.append(batch)
            pull.done(batch)
    finally:
        await pull.stop()
    assert [json.loads(m.data)["seq"] for b in handed for m in b] == list(range(24))


@pytest.mark.timeout(60)
async def test_a_constant_trickle_is_handed_out_within_about_the_linger(
    nc: NATS, stream: str
) -> None:
    """A fact every 20 ms for 4 s into a pull that never fills (batch 1000), linger 0.2 s:
    every fact is handed out within the linger and a margin of its arrival; batches are
    about a linger's worth; none starves."""
    linger, every, total = 0.2, 0.02, 200
    js = nc.jetstream()
    pull = ContinuousPull(nc, stream, "c", batch=1000, window=2000, linger=linger)
    await pull.start()
    sent: dict[int, float] = {}
    waits: list[float] = []
    sizes: list[int] = []

    async def trickle() -> None:
        for i in range(total):
            sent[i] = time.monotonic()
            await js.publish(f"{stream.lower()}.x", str(i).encode())
            await asyncio.sleep(every)

    task = asyncio.create_task(trickle())
    got: list[int] = []
    try:
        while len(got) < total:
            batch = await pull.next_batch(2.0)
            now = time.monotonic()
            assert batch, f"starved after {len(got)} of {total}"
            sizes.append(len(batch))
            for m in batch:
                got.append(int(m.data))
                waits.append(now - sent[int(m.data)])
            pull.done(batch)
            for m in batch:
                await m.ack()
        await task
    finally:
        await pull.stop()
    assert got == list(range(total))
    assert max(waits) < linger + 0.25, max(waits)
    assert len(sizes) < total / 4, sizes  # gathered: a linger's worth, not one each


@pytest.mark.parametrize("linger", [0.0, 0.05])
@pytest.mark.timeout(60)
async def test_a_slow_trickle_is_handed_out_at_once_when_its_pull_requests_expire(
    nc: NATS, stream: str, linger: float
) -> None:
    """A fact every 0.3 s (slower than the linger) into the consumer's pull as it runs
    (requests expire after 1 s, waits of `BCW_CONSUMER_FETCH_TIMEOUT` = 1 s): a request that
    expires while `next_batch` waits for a first fact must be asked again at once, or the
    next fact sits on the server until that wait ends (up to a second: the linger's "an
    effect comes this much later" would not hold)."""
    every, total = 0.3, 14
    js = nc.jetstream()
    pull = ContinuousPull(nc, stream, "c", batch=64, window=128, expires=1.0, linger=linger)
    await pull.start()
    sent: dict[int, float] = {}
    waits: dict[int, float] = {}

    async def trickle() -> None:
        await asyncio.sleep(0.1)
        for i in range(total):
            sent[i] = time.monotonic()
            await js.publish(f"{stream.lower()}.x", str(i).encode())
            await asyncio.sleep(every)

    task = asyncio.create_task(trickle())
    try:
        while len(waits) < total:
            batch = await pull.next_batch(1.0)
            now = time.monotonic()
            for m in batch:
                waits[int(m.data)] = now - sent[int(m.data)]
                await m.ack()
            pull.done(batch)
        await task
    finally:
        await pull.stop()
    slow = {i: round(w, 2) for i, w in waits.items() if w > linger + 0.2}
    assert slow == {}, slow

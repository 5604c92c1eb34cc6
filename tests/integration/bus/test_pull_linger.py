"""The continuous pull's linger (`BCW_CONSUMER_LINGER`) on a real nats-server: facts that
trickle in are handed out as one batch once the linger is over, a batch that fills is
handed out at once (the linger never delays a busy consumer), and without a linger the
first fact goes out alone."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from workers.runtime.bus.pull import ContinuousPull

BATCH = 8


@pytest.fixture
async def stream(nc: NATS) -> AsyncIterator[str]:
    name = f"LINGER_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
    # nothing here acks: no redelivery within a test (a 30 s linger outlasts the default)
    await js.add_consumer(
        name, ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=300)
    )
    yield name
    await js.delete_stream(name)


async def _pull(nc: NATS, stream: str, linger: float) -> ContinuousPull:
    pull = ContinuousPull(nc, stream, "c", batch=BATCH, window=2 * BATCH, linger=linger)
    await pull.start()
    return pull


async def _publish(nc: NATS, stream: str, count: int, every: float = 0.0) -> None:
    js = nc.jetstream()
    for i in range(count):
        await js.publish(f"{stream.lower()}.x", str(i).encode())
        if every:
            await asyncio.sleep(every)


async def test_facts_that_trickle_in_go_out_as_one_batch_after_the_linger(
    nc: NATS, stream: str
) -> None:
    pull = await _pull(nc, stream, linger=0.6)
    try:
        trickle = asyncio.create_task(_publish(nc, stream, 5, every=0.05))
        started = time.monotonic()
        batch = await pull.next_batch(5.0)
        took = time.monotonic() - started
        await trickle
    finally:
        await pull.stop()
    assert [m.data for m in batch] == [b"0", b"1", b"2", b"3", b"4"]
    assert took >= 0.6  # not full: the whole linger was waited


async def test_a_batch_that_fills_goes_out_at_once_whatever_the_linger(
    nc: NATS, stream: str
) -> None:
    pull = await _pull(nc, stream, linger=30.0)
    try:
        filling = asyncio.create_task(_publish(nc, stream, BATCH + 2, every=0.01))
        started = time.monotonic()
        first = await pull.next_batch(5.0)
        took = time.monotonic() - started
        await filling
        rest = await pull.next_batch(5.0)
    finally:
        await pull.stop()
    assert len(first) == BATCH and took < 10.0  # full: the 30 s linger never waited out
    assert [m.data for m in first + rest] == [str(i).encode() for i in range(BATCH + 2)]


async def test_without_a_linger_the_first_fact_goes_out_alone(nc: NATS, stream: str) -> None:
    pull = await _pull(nc, stream, linger=0.0)
    try:
        trickle = asyncio.create_task(_publish(nc, stream, 3, every=0.3))
        first = await pull.next_batch(5.0)
        await trickle
    finally:
        await pull.stop()
    assert [m.data for m in first] == [b"0"]

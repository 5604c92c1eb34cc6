"""`AckedPublisher` on a real nats-server: each future settles with its own PubAck —
stored, a duplicate the stream already had, refused by the stream, or no stream at all —
as the exception `errors.classify` expects from nats-py's own publish."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig

from workers.runtime.base.errors import Severity, classify
from workers.runtime.bus.acked import AckedPublisher


@pytest.fixture
async def stream(nc: NATS) -> AsyncIterator[str]:
    name = f"ACKED_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name=name, subjects=[f"{name.lower()}.>"], max_msgs_per_subject=3)
    )
    yield name
    await js.delete_stream(name)


async def test_every_future_settles_with_its_own_pub_ack(nc: NATS, stream: str) -> None:
    publisher = AckedPublisher(nc)
    root = stream.lower()
    ids = [str(uuid.uuid4()) for _ in range(2000)]
    futures = [
        await publisher.publish(f"{root}.n{i % 500}", b"{}", {"Nats-Msg-Id": msg_id})
        for i, msg_id in enumerate(ids)
    ]
    again = await publisher.publish(f"{root}.n0", b"{}", {"Nats-Msg-Id": ids[0]})  # duplicate
    await asyncio.wait_for(asyncio.gather(*futures, again), 10)
    info = await nc.jetstream().stream_info(stream)
    assert info.state.messages == 1500  # 500 subjects x 3 kept; the duplicate stored nothing
    assert info.state.last_seq == 2000
    assert publisher.pending == 0


async def test_refusals_are_the_exceptions_nats_py_raises(nc: NATS, stream: str) -> None:
    publisher = AckedPublisher(nc)
    nowhere = await publisher.publish(f"nostream{uuid.uuid4().hex[:6]}.x", b"{}", {})
    wrong = await publisher.publish(
        f"{stream.lower()}.x", b"{}", {"Nats-Expected-Stream": "SOMETHING_ELSE"}
    )
    fine = await publisher.publish(f"{stream.lower()}.x", b"{}", {})
    with pytest.raises(nats.js.errors.NoStreamResponseError) as no_stream:
        await asyncio.wait_for(nowhere, 5)
    with pytest.raises(nats.js.errors.APIError) as refused:
        await asyncio.wait_for(wrong, 5)
    assert await asyncio.wait_for(fine, 5) is None
    assert classify(no_stream.value) is Severity.TRANSIENT  # JetStream not there (yet)
    assert refused.value.code == 400
    assert classify(refused.value) is Severity.PERMANENT


async def test_a_future_given_up_on_is_forgotten(nc: NATS, stream: str) -> None:
    publisher = AckedPublisher(nc)
    futures = [await publisher.publish(f"{stream.lower()}.x", b"{}", {}) for _ in range(10)]
    for future in futures[:5]:
        future.cancel()  # what the relay does with a PubAck that did not come in time
    publisher.forget()
    assert publisher.pending <= 5
    await asyncio.wait_for(asyncio.gather(*futures[5:]), 5)
    publisher.forget()
    assert publisher.pending == 0

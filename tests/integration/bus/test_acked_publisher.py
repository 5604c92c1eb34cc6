"""`AckedPublisher` on a real nats-server: each future settles with its own PubAck —
stored, a duplicate the stream already had, refused by the stream, or no stream at all —
as the exception `errors.classify` expects from nats-py's own publish; a fast batch
settles with how many of its messages, from the first, the stream holds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from workers.runtime.base.errors import Severity, classify
from workers.runtime.bus.acked import BATCH_DISABLED, BATCH_FLOW, AckedPublisher, Message


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


@pytest.fixture
async def batched(nc: NATS) -> AsyncIterator[str]:
    """A stream that takes fast batches, small messages only (the last 100 bytes)."""
    name = f"BATCHED_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=name, subjects=[f"{name.lower()}.>"], allow_batched=True, max_msg_size=100
        )
    )
    yield name
    await js.delete_stream(name)


def _messages(stream: str, ids: list[str], body: bytes = b"{}") -> list[Message]:
    return [
        (f"{stream.lower()}.n{i}", body, {"Nats-Msg-Id": msg_id}) for i, msg_id in enumerate(ids)
    ]


async def _received(nc: NATS, subject: str) -> list[bytes]:
    """Every reply the server sends to `subject` (a batch's, under its inbox) from now on."""
    replies: list[bytes] = []

    async def keep(msg: Msg) -> None:
        replies.append(msg.data)

    await nc.subscribe(subject, cb=keep)
    return replies


async def test_a_batch_is_stored_whole_with_one_pub_ack(nc: NATS, batched: str) -> None:
    publisher = AckedPublisher(nc)
    ids = [str(uuid.uuid4()) for _ in range(BATCH_FLOW)]
    first = await publisher.publish_batch(_messages(batched, ids[:1] + ids[:1]))  # start it
    assert await asyncio.wait_for(first, 5) == 2  # a duplicate in a batch counts as held
    replies = await _received(nc, publisher._batch_prefix + ">")
    whole = await publisher.publish_batch(_messages(batched, ids))
    assert await asyncio.wait_for(whole, 5) == BATCH_FLOW
    info = await nc.jetstream().stream_info(batched)
    assert info.state.messages == BATCH_FLOW  # the first id once: the batch's own duplicate
    # one PubAck for the batch and a flow ack or two, not one PubAck a message
    assert len(replies) <= 3
    assert sum(b'"batch"' in reply for reply in replies) == 1
    assert publisher.pending == 0 and not publisher._batches


async def test_a_refused_message_fails_its_batch_and_only_earlier_ones_are_held(
    nc: NATS, batched: str
) -> None:
    publisher = AckedPublisher(nc)
    messages = _messages(batched, [str(uuid.uuid4()) for _ in range(10)])
    subject, _, headers = messages[4]
    messages[4] = (subject, b"x" * 200, headers)  # over the stream's max_msg_size
    with pytest.raises(nats.js.errors.APIError) as refused:
        await asyncio.wait_for(await publisher.publish_batch(messages), 5)
    assert refused.value.err_code == 10054  # the fifth's own refusal: message too large
    assert classify(refused.value) is Severity.PERMANENT
    await asyncio.sleep(0.2)  # the rest of the batch, dropped by the server
    info = await nc.jetstream().stream_info(batched)
    assert info.state.messages == 4  # the caller publishes them all again, one by one
    again = [await publisher.publish(*message) for message in messages]
    outcomes = await asyncio.gather(*again, return_exceptions=True)
    assert [o is None for o in outcomes] == [True] * 4 + [False] + [True] * 5
    assert (await nc.jetstream().stream_info(batched)).state.messages == 9  # each once


async def test_a_stream_without_fast_batches_refuses_the_batch(nc: NATS, stream: str) -> None:
    publisher = AckedPublisher(nc)
    future = await publisher.publish_batch(_messages(stream, [str(uuid.uuid4()) for _ in range(5)]))
    with pytest.raises(nats.js.errors.APIError) as refused:
        await asyncio.wait_for(future, 5)
    assert refused.value.err_code == BATCH_DISABLED
    assert (await nc.jetstream().stream_info(stream)).state.messages == 0
    await asyncio.sleep(0.2)  # every message of it is refused: the later refusals are ignored
    assert not publisher._batches


async def test_a_batch_is_one_to_batch_flow_messages(nc: NATS, batched: str) -> None:
    publisher = AckedPublisher(nc)
    with pytest.raises(ValueError, match="1 to 500"):
        await publisher.publish_batch([])
    with pytest.raises(ValueError, match="1 to 500"):
        await publisher.publish_batch(_messages(batched, ["x"] * (BATCH_FLOW + 1)))

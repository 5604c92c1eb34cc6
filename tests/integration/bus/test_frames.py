"""Frames written at once (`bus.frames`) on a real nats-server: a fast batch framed here
arrives as nats-py would have sent it — subject, body and headers, values trimmed and
CR/LF made spaces — is refused where nats-py's publish refuses (and then sends nothing),
and a batch of acks acks every message once. The probe at start keeps the fast path on
this nats-py and takes the public API where frames do not arrive as sent, or where the
operator turned it off; a worker applies, acks and relays the same on either path."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, StreamConfig

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    build_tally,
    eventually,
    make_settings,
    outbox_empty,
    publish_fact,
    running,
    status_fact,
    tally_rows,
)
from workers.runtime.bus import frames
from workers.runtime.bus.acked import AckedPublisher
from workers.runtime.bus.frames import FrameWriter


@pytest.fixture
async def batched(nc: NATS) -> AsyncIterator[str]:
    name = f"FRAMES_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"], allow_batched=True))
    yield name
    await js.delete_stream(name)


def test_the_tested_client_takes_frames_in_its_write_buffer() -> None:
    # a nats-py without the buffer used still works (one publish a message) but loses
    # what framing saves: this says so when the client changes
    assert FrameWriter(NATS()).buffered


async def test_a_framed_batch_arrives_as_nats_py_would_send_it(nc: NATS, batched: str) -> None:
    root = batched.lower()
    headers = [
        {"Bc-Type": "zombie", "Bc-Schema": "1", "Nats-Msg-Id": str(uuid.uuid4())},
        {" Spaced ": "  value\r\nwith lines ", "Nats-Msg-Id": str(uuid.uuid4()), " ": "x"},
        {"Nats-Msg-Id": str(uuid.uuid4())},
    ]
    bodies = [b'{"node_id": "n-1"}', b"", b"\x00binary\r\n"]
    messages = [(f"{root}.n{i}", bodies[i], headers[i]) for i in range(3)]
    future = await AckedPublisher(nc).publish_batch(messages)
    assert await asyncio.wait_for(future, 5) == 3
    js = nc.jetstream()
    got = [await js.get_msg(batched, seq) for seq in (1, 2, 3)]
    assert [m.subject for m in got] == [f"{root}.n0", f"{root}.n1", f"{root}.n2"]
    assert [m.data or b"" for m in got] == bodies
    assert {k: v for k, v in (got[0].headers or {}).items() if not k.startswith("Nats-Batch")} == (
        headers[0]
    )
    second = got[1].headers or {}
    assert second["Spaced"] == "value  with lines"  # trimmed, CR/LF made spaces, as nats-py
    assert " " not in second and "" not in second  # an empty key is left out


@pytest.mark.parametrize(
    ("subject", "body", "headers", "error"),
    [
        ("with space", b"{}", {}, nats.errors.BadSubjectError),
        ("inject\r\nPUB x 1", b"{}", {}, nats.errors.BadSubjectError),
        ("", b"{}", {}, nats.errors.BadSubjectError),
        ("ok", b"{}", {"Bad:Key": "v"}, nats.errors.BadHeaderError),
        ("ok", b"x" * (2 * 1024 * 1024), {}, nats.errors.MaxPayloadError),
    ],
)
async def test_a_batch_with_a_message_nats_py_refuses_sends_nothing(
    nc: NATS, batched: str, subject: str, body: bytes, headers: dict[str, str], error: type
) -> None:
    root = batched.lower()
    fine = (f"{root}.a", b"{}", {"Nats-Msg-Id": str(uuid.uuid4())})
    bad = ("" if subject == "" else f"{root}.{subject}", body, headers)
    publisher = AckedPublisher(nc)
    with pytest.raises(error):
        await publisher.publish_batch([fine, bad, fine])
    assert not publisher._batches
    await nc.flush()
    assert (await nc.jetstream().stream_info(batched)).state.messages == 0


async def test_a_batch_of_acks_acks_each_message_once(nc: NATS, batched: str) -> None:
    js = nc.jetstream()
    root = batched.lower()
    for i in range(300):
        await js.publish(f"{root}.n{i}", b"{}")
    await js.add_consumer(batched, ConsumerConfig(durable_name="acks", ack_wait=30))
    sub = await js.pull_subscribe_bind("acks", stream=batched)
    msgs: list[Msg] = []
    while len(msgs) < 300:
        msgs += await sub.fetch(300 - len(msgs), timeout=5)
    await FrameWriter(nc).write_acks(msgs)

    async def all_acked() -> bool:  # the server takes acks in apart from the connection
        info = await js.consumer_info(batched, "acks")
        return info.num_ack_pending == 0 and info.ack_floor.stream_seq == 300

    await eventually(all_acked, within=10, what="every message acked")
    info = await js.consumer_info(batched, "acks")
    assert info.num_redelivered == 0 and info.delivered.stream_seq == 300  # each once
    with pytest.raises(nats.errors.MsgAlreadyAckdError):  # as after Msg.ack
        await msgs[0].ack()


async def test_a_message_without_a_reply_subject_is_not_acked_as_msg_ack_refuses_it(
    nc: NATS,
) -> None:
    plain = Msg(_client=nc, subject="core.subject", reply="", data=b"{}")
    with pytest.raises(nats.errors.NotJSMessageError):
        await FrameWriter(nc).write_acks([plain])
    assert not plain._ackd and nc.is_connected  # nothing malformed went out


async def test_the_probe_keeps_the_fast_path_and_a_client_that_mangles_frames_loses_it(
    servers: Servers,
) -> None:
    good, mangling, off = [await nats.connect(servers.nats_url) for _ in range(3)]
    try:
        assert await frames.verify(good) and FrameWriter(good).buffered
        send = mangling._send_command

        async def mangled(cmd: bytes, priority: bool = False) -> None:
            # a buffer that takes the bytes but not as they were meant: the second message
            # arrives with the first one's body
            await send(cmd.replace(b"probe-2", b"probe-1"), priority)

        mangling._send_command = mangled  # type: ignore[method-assign]
        assert not await frames.verify(mangling, within=1.0)
        assert not FrameWriter(mangling).buffered and mangling.is_connected  # it lives on
        assert not await frames.verify(off, enabled=False) and not FrameWriter(off).buffered
    finally:
        for nc in (good, mangling, off):
            await nc.close()


@pytest.mark.parametrize("fast_path", [True, False], ids=["frames", "public-api"])
async def test_a_worker_applies_acks_and_relays_the_same_on_either_path(
    servers: Servers, subjects: Subjects, tally_db: str, fast_path: bool
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects)
    settings = settings.model_copy(
        update={"nats": settings.nats.model_copy(update={"fast_path": fast_path})}
    )
    async with running(settings, [build_tally()]) as (runtime, _port):
        assert FrameWriter(runtime.nc).buffered is fast_path
        js = runtime.js
        for i in range(20):
            await publish_fact(js, subjects, status_fact(node_id=f"node-{i}"))
        await eventually(lambda: tally_rows(tally_db, 20), what="20 facts applied")
        await eventually(lambda: outbox_empty(tally_db), what="what they published relayed")

        async def acked() -> bool:
            info = await js.consumer_info(subjects.facts_stream, "tally")
            return info.num_ack_pending == 0 and info.num_pending == 0

        await eventually(acked, what="every fact acked")
        info = await js.consumer_info(subjects.facts_stream, "tally")
        assert info.num_redelivered == 0

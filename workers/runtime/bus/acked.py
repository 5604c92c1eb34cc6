"""JetStream publishes whose PubAcks come back on one reply subscription of ours.

Used by the outbox relay, which publishes a batch of rows pipelined and then waits for
their PubAcks. nats-py's `publish_async` does the same with a semaphore wait, a NUID and
a done-callback per message and a full JSON and dataclass decode per PubAck; measured on
the development machine it bounds a process near 10,000 publishes/s, where this path
reaches about 19,000. A PubAck is decoded only when it says something went wrong.

The futures resolve to None (stored, or a duplicate the stream already had: either way
the message is in the stream) or fail with the exception `publish_async` would raise, so
`errors.classify` judges them the same.

`publish_batch` sends the messages of one stream as a JetStream fast batch (nats-server
2.14+, a stream with `allow_batched`): the server answers a few flow acks and one PubAck
for the whole batch instead of one per message, which halves what a message costs this
process. The batch's future settles with how many of its messages, from the first, the
stream holds (a duplicate counts as held); the rest were not stored and the caller
publishes them again one by one (`publish`, same `Nats-Msg-Id`), which names each one's
own failure. A message the stream refuses fails the whole batch (which of the batch are
held is then not known): the caller publishes them all one by one, and the stream drops
those it already has. A server without fast batches stores each message and acks it
alone: the batch settles when all are acked.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from workers.runtime.bus.frames import FrameWriter, check_subject, header_block, hpub

NO_RESPONDERS = "503"
#: the server's error code for a stream that does not allow fast batches
BATCH_DISABLED = 10205
#: messages the server may take before its next flow ack; a batch is never longer, so a
#: sender never waits on flow control mid-batch
BATCH_FLOW = 500
_START, _APPEND, _COMMIT = 0, 1, 2

Message = tuple[str, bytes, dict[str, str]]
"""subject, body, headers"""


@dataclass
class _Batch:
    future: asyncio.Future[int]
    size: int
    plain: int = 0  # messages acked one by one (a server without fast batches)


class AckedPublisher:
    """Publish to JetStream, each message's PubAck a future (see the module docstring)."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._futures: dict[str, asyncio.Future[None]] = {}
        self._tokens = itertools.count()
        self._batches: dict[str, _Batch] = {}
        self._batch_prefix = ""  # <inbox>.b. : a batch's replies come back under it
        self._batch_sub: Subscription | None = None
        self._frames = FrameWriter(nc)

    async def _start(self) -> None:
        self._prefix = self._nc.new_inbox() + "."
        self._sub = await self._nc.subscribe(
            self._prefix + "*", cb=self._on_reply, pending_msgs_limit=1_000_000
        )
        self._batch_prefix = self._prefix + "b."
        self._batch_sub = await self._nc.subscribe(
            self._batch_prefix + ">", cb=self._on_batch_reply, pending_msgs_limit=1_000_000
        )

    async def publish(
        self, subject: str, body: bytes, headers: dict[str, str]
    ) -> asyncio.Future[None]:
        """Send one message; the future settles with its PubAck. A future that is given
        up on must be passed to `forget`."""
        if self._sub is None:
            await self._start()
        token = str(next(self._tokens))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures[token] = future
        try:
            await self._nc.publish(subject, body, reply=self._prefix + token, headers=headers)
        except BaseException:
            del self._futures[token]
            raise
        return future

    async def publish_batch(self, messages: Sequence[Message]) -> asyncio.Future[int]:
        """Send `messages`, all bound for one stream and at most `BATCH_FLOW` of them, as
        one fast batch; the future settles with how many of them, from the first, the
        stream holds, or fails with the first refusal of one of them (`BATCH_DISABLED`:
        the stream takes no batch) — then which are held is not known, and the caller
        publishes them all again one by one: JetStream drops those it already has.
        A future that is given up on must be passed to `forget`."""
        if not 0 < len(messages) <= BATCH_FLOW:
            raise ValueError(f"a batch holds 1 to {BATCH_FLOW} messages, not {len(messages)}")
        if self._sub is None:
            await self._start()
        # unique on the stream across every client: the inbox's own token and a counter
        batch_id = self._prefix.split(".")[-2] + str(next(self._tokens))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._batches[batch_id] = _Batch(future, len(messages))
        reply = f"{self._batch_prefix}{batch_id}.{BATCH_FLOW}.fail."
        last = len(messages)
        try:
            if self._frames.buffered:  # framed here, one write (`frames`)
                await self._frames.write(_framed(messages, reply, self._nc.max_payload), last)
            else:
                for seq, (subject, body, headers) in enumerate(messages, 1):
                    await self._nc.publish(
                        subject, body, reply=_member_reply(reply, seq, last), headers=headers
                    )
        except BaseException:
            del self._batches[batch_id]
            raise
        return future

    def forget(self) -> None:
        """Drop the futures nobody waits for any more (timed out and cancelled)."""
        self._futures = {t: f for t, f in self._futures.items() if not f.done()}
        self._batches = {t: b for t, b in self._batches.items() if not b.future.done()}

    @property
    def pending(self) -> int:
        return len(self._futures)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._futures.pop(msg.subject[len(self._prefix) :], None)
        if future is None or future.done():
            return
        if not msg.headers and b'"error"' not in msg.data:  # {"stream": …, "seq": …}
            future.set_result(None)
            return
        try:
            _pub_ack(msg)
        except nats.js.errors.Error as refused:
            future.set_exception(refused)
        else:
            future.set_result(None)  # a stream whose name is "error", say

    async def _on_batch_reply(self, msg: Msg) -> None:
        batch_id = msg.subject[len(self._batch_prefix) :].split(".", 1)[0]
        batch = self._batches.get(batch_id)
        if batch is None or batch.future.done():
            return  # a batch settled, or one given up on (a late reply)
        if b'"type"' in msg.data:
            return  # flow control ({"type": "ack" | "gap" | "err", …}): the PubAck follows
        try:
            ack = _pub_ack(msg)
        except nats.js.errors.Error as refused:  # the batch ends, what it left unknown
            del self._batches[batch_id]
            batch.future.set_exception(refused)
            return
        if "batch" in ack:  # the batch's PubAck: its first `count` messages are held
            del self._batches[batch_id]
            batch.future.set_result(min(int(ack.get("count", 0)), batch.size))
        else:  # a server without fast batches acks each message as it stores it
            batch.plain += 1
            if batch.plain == batch.size:
                del self._batches[batch_id]
                batch.future.set_result(batch.size)


def _member_reply(reply: str, seq: int, last: int) -> str:
    """The reply subject of a fast batch's message `seq` (from 1) of `last`: its place and
    whether it starts, continues or commits the batch."""
    op = _COMMIT if seq == last else _START if seq == 1 else _APPEND
    return f"{reply}{seq}.{op}.$FI"


def _framed(messages: Sequence[Message], reply: str, max_payload: int) -> bytes:
    """A fast batch's messages as protocol frames, each checked as nats-py's publish
    checks it (the batch is sent whole or not at all)."""
    frames, last = [], len(messages)
    for seq, (subject, body, headers) in enumerate(messages, 1):
        if len(body) > max_payload:
            raise nats.errors.MaxPayloadError
        member = _member_reply(reply, seq, last)
        frames.append(hpub(check_subject(subject), member, header_block(headers), body))
    return b"".join(frames)


def _pub_ack(msg: Msg) -> dict[str, Any]:
    """The PubAck `msg` carries; raises what nats-py's own publish raises for a refusal:
    no stream at all, a reply that is no PubAck, or the error the PubAck names."""
    if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
        raise nats.js.errors.NoStreamResponseError
    try:
        ack = json.loads(msg.data)
        error = ack.get("error")
    except (ValueError, AttributeError) as bad:
        raise nats.js.errors.APIError(description=f"bad PubAck: {bad}") from None
    if error is not None:
        raise _refusal(error)
    return ack


def _refusal(error: object) -> nats.js.errors.APIError:
    """The exception a PubAck's `error` names (`APIError.from_error` raises it)."""
    try:
        nats.js.errors.APIError.from_error(error)  # type: ignore[arg-type]
    except nats.js.errors.APIError as refused:
        return refused
    except (KeyError, TypeError):
        pass
    return nats.js.errors.APIError(description=f"PubAck error: {error!r}")
